"""mcptasks with django-oauth-toolkit: the parts of MCP authorization that
build on the toolkit (install ``mcptasks[oauth]``).

* :mod:`mcptasks.oauth.urls`: RFC 9728 protected resource metadata for the MCP
  endpoint, the toolkit's view filled from ``MCPTASKS``;
* :mod:`mcptasks.oauth.registration`: a dynamic client registration
  permission for MCP clients, which register before anyone has signed in;
* :mod:`mcptasks.oauth.authentication`: the toolkit's DRF authentication,
  without its overhead on requests that carry no bearer token.

The resource-server checks on the endpoint itself (mcptasks.web.authorization
and mcptasks.protocol.authorization) do not need the toolkit; only these
modules import it. This package sits at the edge, beside the URLconf: it may
import ``web``, and nothing else in the app imports it (contracts in
pyproject.toml).
"""
