"""The HTTP server: app.py (FastAPI app, routes, errors), guard.py (API key, body size, body timeout, lone
surrogates), connection.py (uvicorn's protocol with a header timeout), limits.py (the limits' defaults),
openai.py, anthropic.py, protocol.py (request bodies), responses.py (response bodies), openapi.py (what
/openapi.json adds to the models), serving.py (shared helpers), template_worker.py (chat templates rendered in
worker processes), metrics.py (/metrics), errors.py. Started by `ramlm serve`."""
