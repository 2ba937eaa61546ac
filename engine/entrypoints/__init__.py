"""What users call: the LLM class, the CLI commands and the HTTP server."""
