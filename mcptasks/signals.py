"""Lifecycle signals, sent only after the change is committed.

``task_changed`` fires for every committed status change (and for an input
request being answered), with ``task_id``, ``from_status``, ``to_status`` and
``actor``, plus ``task`` (the row as that change left it) and
``pending_inputs`` when anything listens. A running task's new status
message fires it too (``kind="status_message"``), with ``progress``: the
numbers its tool gave (``progress``, ``total``, ``message``, as
``notifications/progress`` carries them), else ``None``. Notification
publishing and site hooks listen to it.
"""

from django.dispatch import Signal

task_created = Signal()
task_changed = Signal()
#: The tool (``kind="tools"``), prompt (``kind="prompts"``) or resource
#: (``kind="resources"``, static resources and templates) list changed.
registry_changed = Signal()
