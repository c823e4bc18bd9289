"""Deactivating a user revokes their tokens.

When a user is saved with ``is_active = False`` (the admin's checkbox, say),
every grant, access token and refresh token django-oauth-toolkit holds for
them is revoked, so nothing of their sign-ins outlives the decision; the
validator (:mod:`mcptasks.oauth.validators`) and the MCP endpoint refuse an
inactive user's credentials in any case. Connected by
:class:`mcptasks.oauth.apps.MCPTasksOAuthConfig`.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_grant_model, get_refresh_token_model


def revoke_tokens_of(user: Any) -> None:
    """Revoke every grant and token issued to ``user``."""
    with transaction.atomic():
        get_grant_model().objects.filter(user=user).delete()
        get_refresh_token_model().objects.filter(user=user, revoked__isnull=True).update(
            revoked=timezone.now(), access_token=None
        )
        get_access_token_model().objects.filter(user=user).delete()


def revoke_on_deactivation(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``post_save`` receiver for the user model."""
    if kwargs.get("raw") or getattr(instance, "is_active", True):
        return
    revoke_tokens_of(instance)
