"""The HTTP server: app.py (FastAPI app, guard, errors), openai.py, anthropic.py, protocol.py (request
bodies), serving.py (shared helpers), metrics.py (/metrics), errors.py. Started by `ramlm serve`."""
