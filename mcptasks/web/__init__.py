"""The HTTP adapter: the endpoint view, the ASGI router, and who the caller is."""
