"""Server: the Starlette app, the wire contract per family, admission and scheduling."""
