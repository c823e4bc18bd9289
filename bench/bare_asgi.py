"""The ASGI floor: the cheapest possible app under the same uvicorn command,
answering every request with constant JSON (no Django at all).

mcptasks serves ``/mcp`` straight from ASGI, past Django's handler and
middleware, so under uvicorn a bare *Django* view is no ceiling for it; this is.

    uvicorn bench.bare_asgi:app --workers 2 --loop uvloop --http httptools
"""

BODY = b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete"}}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":  # lifespan and the like: nothing to do
        return
    more = True
    while more:  # read the request body to its end
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
