"""Lifecycle signals, sent only after the change is committed.

``task_changed`` fires for every committed status change (and for an input
request being answered), with ``task_id``, ``from_status``, ``to_status`` and
``actor``, plus ``task`` (the row as that change left it) and
``pending_inputs`` when anything listens. Notification publishing and site
hooks listen to it.
"""

from django.dispatch import Signal

task_created = Signal()
task_changed = Signal()
#: The tool (``kind="tools"``), prompt (``kind="prompts"``) or resource
#: (``kind="resources"``, static resources and templates) list changed.
registry_changed = Signal()
