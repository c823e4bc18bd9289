"""django-oauth-toolkit's request validator, refusing deactivated users.

The toolkit checks a token's expiry, revocation and audience but never whether
its user may still sign in: a user set ``is_active = False`` kept using their
access tokens and minted new ones with their refresh tokens. A site names this
class as ``OAUTH2_PROVIDER["OAUTH2_VALIDATOR_CLASS"]``.

Deactivating a user also revokes their tokens (:mod:`mcptasks.oauth.deactivation`),
but a bulk ``update(is_active=False)`` sends no signal: these checks are what
holds whatever way the flag was set.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


def user_active(user: Any) -> bool:
    """Whether ``user`` (or no user at all, for a client's own grant) may act."""
    return user is None or bool(getattr(user, "is_active", True))


class ActiveUserOAuth2Validator(OAuth2Validator):
    """The toolkit's validator; a token, refresh token or authorization code
    of a deactivated user is invalid."""

    def validate_bearer_token(self, token: Any, scopes: Any, request: Any) -> bool:
        if not super().validate_bearer_token(token, scopes, request):
            return False
        if user_active(getattr(request, "user", None)):
            return True
        request.oauth2_error = OrderedDict([("error", "invalid_token"), ("error_description", "User inactive.")])
        return False

    def validate_refresh_token(self, refresh_token: Any, client: Any, request: Any, *args: Any, **kwargs: Any) -> bool:
        valid = super().validate_refresh_token(refresh_token, client, request, *args, **kwargs)
        return bool(valid) and user_active(getattr(request, "user", None))

    def validate_code(self, client_id: Any, code: Any, client: Any, request: Any, *args: Any, **kwargs: Any) -> bool:
        valid = super().validate_code(client_id, code, client, request, *args, **kwargs)
        return bool(valid) and user_active(getattr(request, "user", None))
