"""The HTTP server: app.py (FastAPI app, guard, errors), openai.py, anthropic.py, protocol.py (request
bodies), responses.py (response bodies), openapi.py (what /openapi.json adds to the models), serving.py
(shared helpers), metrics.py (/metrics), errors.py. Started by `ramlm serve`."""
