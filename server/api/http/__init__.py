"""The HTTP front door: LibreTranslate's API, the .proto's JSON, a translation page.

An ASGI app (FastAPI on uvicorn) in the same process and event loop as the gRPC
server; both call the same application core (server/core/translator.py)."""
