"""The wire layer: the JSON-RPC envelope and the two protocol eras.

Nothing here touches Celery or Channels; task state is read and changed only
through ``mcptasks.lifecycle`` and the models.
"""
