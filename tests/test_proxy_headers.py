"""``mcptasks run`` believes ``X-Forwarded-For`` / ``X-Forwarded-Proto`` only
from the proxies it is told to trust (``--forwarded-allow-ips`` or the
``FORWARDED_ALLOW_IPS`` environment variable), not from loopback by default.

Here the server configuration it builds; tests/test_live_proxy_headers.py
starts it and shows what the site then advertises.
"""

from __future__ import annotations

from mcptasks.worker.runner import server_config


def test_server_config_trusts_no_proxy_unless_told():
    untold = server_config(object(), host="127.0.0.1", port=1, forwarded_allow_ips=None)
    assert untold.proxy_headers is False
    for blank in ("", "  "):
        assert server_config(object(), host="127.0.0.1", port=1, forwarded_allow_ips=blank).proxy_headers is False
    told = server_config(object(), host="127.0.0.1", port=1, forwarded_allow_ips="10.0.0.1, 127.0.0.1")
    assert told.proxy_headers is True
    assert told.forwarded_allow_ips == "10.0.0.1, 127.0.0.1"
