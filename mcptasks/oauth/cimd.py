"""Client ID Metadata Documents, fetched within one deadline and held to the
rules of registration.

django-oauth-toolkit fetches a CIMD client's document on the unauthenticated
authorize and token endpoints. Its fetcher bounds each socket operation, not
the fetch: a server that sends its document a byte at a time held a worker for
as long as it liked, and ten of them filled ``CIMD_MAX_CONCURRENT_FETCHES`` so
that every other CIMD client failed to sign in. It also saved any redirect
URI and the implicit grant. This fetcher (``OAUTH2_PROVIDER
["CIMD_METADATA_FETCHER"]``) keeps the toolkit's address rules (https only;
the host resolved once, every address public, the connection made to that
address; no redirects; ``CIMD_MAX_DOCUMENT_SIZE``) and adds:

* one wall-clock deadline, ``CIMD_FETCH_TIMEOUT_SECONDS``, over the whole
  fetch: name resolution, connection, TLS handshake, headers and body. At the
  deadline the connection is shut down under whatever is reading it;
* the registration rules of :func:`mcptasks.oauth.registration.metadata_allowed`.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import ParseResult

from oauth2_provider import cimd
from oauth2_provider.settings import oauth2_settings

from .registration import metadata_allowed

#: Most name lookups left running after their fetch gave up on them: a lookup
#: cannot be interrupted, so a flood of slow-resolving hosts is refused rather
#: than left to pile up threads.
MAX_PENDING_LOOKUPS = 32

_pending_lookups = threading.BoundedSemaphore(MAX_PENDING_LOOKUPS)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def left(self) -> float:
        """The time left, or ``CIMDError`` once there is none."""
        remaining = self.remaining()
        if remaining <= 0:
            raise cimd.CIMDError(f"client_id document not fetched within {self.seconds:g} s")
        return remaining


def resolve_within(hostname: str, port: int, deadline: Deadline) -> list[str]:
    """The toolkit's resolution and address check, given up at the deadline."""
    if not _pending_lookups.acquire(blocking=False):
        raise cimd.CIMDError("too many client_id host lookups in flight")
    outcome: dict[str, Any] = {}

    def lookup() -> None:
        try:
            outcome["ips"] = cimd._resolve_and_validate(hostname, port)
        except Exception as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            _pending_lookups.release()

    thread = threading.Thread(target=lookup, name="cimd-lookup", daemon=True)
    thread.start()
    thread.join(deadline.left())
    if thread.is_alive():
        raise cimd.CIMDError(f"client_id host not resolved within {deadline.seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    ips: list[str] = outcome["ips"]
    return ips


class _Cutoff:
    """Shuts a connection down at the deadline, under whatever is blocked on it."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self._guard = sock.dup()  # its own descriptor: never one reused by another socket
        self._lock = threading.Lock()
        self._done = False
        self.fired = False
        self._timer = threading.Timer(max(deadline.remaining(), 0.0), self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            with contextlib.suppress(OSError):
                self._guard.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            self._guard.close()


class MCPClientMetadataFetcher(cimd.SafeMetadataFetcher):
    """``CIMD_METADATA_FETCHER``: see the module docstring."""

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        deadline = Deadline(float(oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS))
        parsed = cimd._validate_client_id_url(client_id)
        port = parsed.port or 443
        last_error: Exception | None = None
        for ip in resolve_within(parsed.hostname or "", port, deadline):
            try:
                metadata, max_age = self._fetch_from(ip, port, parsed, deadline)
            except (OSError, http.client.HTTPException) as exc:
                last_error = exc
                continue
            if not metadata_allowed(metadata):
                raise cimd.CIMDError(
                    "client metadata asks for more than an MCP client may have "
                    "(authorization code only; https or loopback redirect URIs)"
                )
            return metadata, max_age
        deadline.left()
        raise cimd.CIMDError(f"could not fetch client_id document: {last_error}")

    def _fetch_from(self, ip: str, port: int, parsed: ParseResult, deadline: Deadline) -> tuple[dict[str, Any], int]:
        sock = socket.create_connection((ip, port), timeout=deadline.left())
        cutoff = _Cutoff(sock, deadline)
        try:
            # SNI, certificate and Host name the real host; the connection
            # stays on the address that was checked.
            tls = ssl.create_default_context().wrap_socket(sock, server_hostname=parsed.hostname)
            connection = http.client.HTTPSConnection(parsed.hostname or ip, port, timeout=deadline.left())
            connection.sock = tls
            try:
                path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
                headers = {"Host": parsed.netloc, "Accept": "application/json, application/*+json"}
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                document: tuple[dict[str, Any], int] = self._read_document(response)
            finally:
                connection.close()
        except (OSError, http.client.HTTPException, cimd.CIMDError):
            if cutoff.fired:
                deadline.left()  # raises: the deadline, not the broken read, is the reason
            raise
        finally:
            cutoff.close()
            sock.close()
        return document
