"""The short and full forms of the chaos tests, and the figures they record.

The fixtures they share are in ``tests/conftest.py`` (``private_services``)
and ``tests/reliability/conftest.py``.

Short and full forms: a test parametrized with ``FORMS`` runs its short form
by default; the full form is marked ``slow`` and runs only with
``MCPTASKS_CHAOS=full`` (``MCPTASKS_CHAOS=full bin/test -m slow``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

FULL = os.environ.get("MCPTASKS_CHAOS", "").lower() == "full"

FORMS = [
    pytest.param("short", id="short"),
    pytest.param(
        "full",
        id="full",
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(not FULL, reason="the full form runs with MCPTASKS_CHAOS=full"),
        ],
    ),
]

#: Where each run appends its figures (one JSON object a line), for docs/reliability.md.
FIGURES_FILE = os.environ.get("MCPTASKS_CHAOS_FIGURES")


def record_figures(name: str, form: str, figures: dict[str, Any]) -> None:
    """Print a run's figures (``pytest -s`` shows them; ``-ra`` keeps them on
    failure) and append them to ``MCPTASKS_CHAOS_FIGURES`` when it is set."""
    line = json.dumps({"test": name, "form": form, **figures}, default=str, sort_keys=True)
    print(f"\nFIGURES {line}")
    if FIGURES_FILE:
        with open(FIGURES_FILE, "a") as out:
            out.write(line + "\n")
