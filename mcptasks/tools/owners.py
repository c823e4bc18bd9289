"""The owner of a task: the string every task method checks, and the Django
user behind it. A caller authenticated as a Django user owns its tasks as
``user:<pk>``; other owners (the anonymous owner, a site's own) have no user."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

USER_PREFIX = "user:"


def owner_for(user: Any) -> str:
    """A stable identity string for an authenticated Django user."""
    return f"{USER_PREFIX}{user.pk}"


def user_for_owner(owner: str) -> Any:
    """The Django user who owns ``owner``'s tasks, or ``None`` when the owner is
    not a user or the user no longer exists."""
    if not owner.startswith(USER_PREFIX):
        return None
    try:
        return get_user_model()._default_manager.filter(pk=owner[len(USER_PREFIX) :]).first()
    except (ValueError, ValidationError):  # not a key of this user model
        return None
