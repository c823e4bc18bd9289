"""A Client ID Metadata Document server on loopback, over TLS, for tests of
the authorization server's fetch: documents served at once or a byte at a
time.

Its certificate (for ``localhost``) is made per server; a process trusts it
through ``SSL_CERT_FILE`` (``cert_file``). The fetcher refuses loopback
addresses, so a test that uses this server also relaxes that refusal, in the
test alone (tests/support/cimd_loopback.py).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def write_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``localhost`` and 127.0.0.1: (cert, key) files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cimd-cert.pem", directory / "cimd-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


@dataclass
class Served:
    """What one request got: its path, and when the server stopped sending
    (``cut_off``: the client had gone away before the whole body was sent)."""

    path: str
    started: float
    ended: float | None = None
    cut_off: bool = False


@dataclass
class DocumentServer:
    port: int
    cert_file: Path
    #: path -> (body, seconds between bytes; 0 sends at once)
    documents: dict[str, tuple[bytes, float]] = field(default_factory=dict)
    served: list[Served] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"https://localhost:{self.port}{path}"

    def add(self, path: str, document: Mapping[str, Any] | bytes, *, drip: float = 0.0) -> str:
        """Serve ``document`` at ``path`` (its ``client_id`` filled in); the URL."""
        if isinstance(document, bytes):
            body = document
        else:
            body = json.dumps({"client_id": self.url(path), **document}).encode()
        self.documents[path] = (body, drip)
        return self.url(path)

    def requests_for(self, path: str) -> list[Served]:
        return [entry for entry in self.served if entry.path == path]


@contextlib.contextmanager
def document_server(directory: Path) -> Iterator[DocumentServer]:
    cert_file, key_file = write_certificate(directory)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    state: dict[str, DocumentServer] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            server = state["server"]
            entry = Served(path=self.path, started=time.monotonic())
            server.served.append(entry)
            body, drip = server.documents.get(self.path, (b"", 0.0))
            if self.path not in server.documents:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if not drip:
                    self.wfile.write(body)
                else:
                    self.wfile.flush()
                    for index in range(len(body)):
                        self.wfile.write(body[index : index + 1])
                        self.wfile.flush()
                        time.sleep(drip)
            except OSError:
                entry.cut_off = True
            finally:
                entry.ended = time.monotonic()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    state["server"] = DocumentServer(port=httpd.server_address[1], cert_file=cert_file)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state["server"]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
