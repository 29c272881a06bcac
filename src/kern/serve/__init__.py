"""kern serve: an OpenAI-compatible HTTP server over the host loop (FastAPI + uvicorn)."""
