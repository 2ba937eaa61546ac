"""The server's limits and their defaults, in one dependency-free module (`ramlm serve --help` reads them
without importing fastapi)."""

MAX_BODY_BYTES = 8 * 2**20  # larger request bodies get 413
HEADER_TIMEOUT_S = 10.0  # request line and headers must be in by then (connection.py)
BODY_TIMEOUT_S = 30.0  # longest pause inside a request body (guard.py)
CHAT_TEMPLATE_TIMEOUT_S = 10.0  # longest chat template render (template_worker.py)
LIMIT_CONCURRENCY = 512  # open connections or requests before new requests get 503 (uvicorn)
TIMEOUT_KEEP_ALIVE_S = 5  # idle keep-alive connections close after this (uvicorn's and vLLM's default)
H11_MAX_INCOMPLETE_EVENT_SIZE = 16 * 1024  # most bytes of request line and headers (h11's default)
