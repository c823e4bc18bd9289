"""The old path of the domain's API, kept for code written against it; the
functions live in ``mcptasks.tasks`` (see ``mcptasks.tasks.lifecycle``)."""

from .tasks.lifecycle import *  # noqa: F403
from .tasks.lifecycle import __all__  # noqa: F401
