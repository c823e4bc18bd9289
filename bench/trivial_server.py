"""A trivial HTTP/1.1 server (uvloop, raw protocol) answering every request
with constant JSON: the yardstick showing that the load generator reaches far
higher rates than any server under test, so it is never the bottleneck.

    python -m bench.trivial_server PORT
"""

from __future__ import annotations

import asyncio
import sys

BODY = b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete"}}'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        out = []
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = self.buf[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            total = end + 4 + length
            if len(self.buf) < total:
                break
            self.buf = self.buf[total:]
            out.append(RESPONSE)
        if out:
            self.transport.write(b"".join(out))  # type: ignore[attr-defined]


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(int(sys.argv[1])))
