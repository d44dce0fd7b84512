"""Server: the Starlette app, the wire contract, admission, and the ``s1omni`` command line."""
