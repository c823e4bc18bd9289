"""The public path of caller identification (settings name
``mcptasks.identity.BearerTokenAuthentication``, sites import ``owner_for``);
the code lives in ``mcptasks.web.identity``. A package rather than a module
file, so that the file's history follows the code to ``web/``."""

from ..web.identity import BearerTokenAuthentication, Caller, NotAuthenticated, identify, owner_for

__all__ = ["BearerTokenAuthentication", "Caller", "NotAuthenticated", "identify", "owner_for"]
