"""The protocol layer: the JSON-RPC envelope, the shared task shapes, and the
two protocol eras (``modern/`` and ``legacy/``).

Task state is read and changed only through the domain (``mcptasks.tasks``)
and the models. Nothing here touches Celery; notifications travel through
the fabric in ``mcptasks.notify``.
"""
