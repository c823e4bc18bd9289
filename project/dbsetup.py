"""``python -m project.dbsetup``: create the example site's Postgres database if
it does not exist yet, so that ``bin/run`` with ``DATABASE_URL`` naming a new
database works on a fresh server. Nothing to do on SQLite (migrate makes the
file) or when the database is there.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


def ensure_database() -> str | None:
    """The name of the database this created, or ``None`` when none was needed."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if "postgresql" not in database["ENGINE"]:
        return None
    import psycopg
    from psycopg import sql

    params = {
        key: value
        for key, value in {
            "host": database.get("HOST"),
            "port": database.get("PORT"),
            "user": database.get("USER"),
            "password": database.get("PASSWORD"),
        }.items()
        if value
    }
    name = database["NAME"]
    # The server's maintenance database: the site's own cannot be reached yet.
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return None
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


if __name__ == "__main__":
    created = ensure_database()
    if created:
        print(f"mcptasks: created the database {created}", file=sys.stderr)
