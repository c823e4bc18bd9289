"""The example site's ``SECRET_KEY`` when the environment gives none.

``python -m project.secret_key`` (run by ``bin/run`` before anything else)
makes a random key in ``var/secret_key`` the first time, readable by its
owner only, and keeps it from then on: sessions, password reset links and
signed MRTR request state stay valid across restarts. ``var/`` is ignored by
git, so the key is never committed. Nothing is made when ``SECRET_KEY`` is set
in the environment or in ``.env``, which then wins.

Without either (``manage.py`` run by hand in a fresh checkout), the settings
fall back to a public development key whose ``django-insecure-`` prefix makes
``manage.py check --deploy`` flag it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
KEY_FILE = BASE_DIR / "var" / "secret_key"
DEVELOPMENT_KEY = "django-insecure-example-site-development-key-not-for-any-real-use"


def read_key(path: Path) -> str | None:
    """The key kept in ``path``, or ``None`` when there is none yet."""
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        return None
    return key or None


def make_key(path: Path) -> str:
    """The key in ``path``, made first if there is none. Two starts at once
    agree on one key: it is written whole to a private file, then linked into
    place, which fails for the second."""
    existing = read_key(path)
    if existing:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_urlsafe(50) + "\n")
        with contextlib.suppress(FileExistsError):  # another start made it first: keep theirs
            os.link(draft, path)
    finally:
        draft.unlink(missing_ok=True)
    key = read_key(path)
    if key is None:
        raise RuntimeError(f"{path} is empty: remove it or set SECRET_KEY")
    return key


def configured_key() -> str | None:
    """``SECRET_KEY`` from the environment or ``.env``, as the settings read it."""
    import environ

    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)
    return os.environ.get("SECRET_KEY") or None


if __name__ == "__main__":
    if configured_key() is None:
        make_key(KEY_FILE)
