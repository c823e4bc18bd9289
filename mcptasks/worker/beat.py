"""The periodic maintenance, for ``CELERY_BEAT_SCHEDULE``.

Importable from settings (it loads no models)::

    from mcptasks.worker.beat import BEAT_SCHEDULE
    CELERY_BEAT_SCHEDULE = {**BEAT_SCHEDULE}
"""

BEAT_SCHEDULE = {
    "mcptasks-sweep": {"task": "mcptasks.sweep", "schedule": 10.0},
    "mcptasks-prune-expired": {"task": "mcptasks.prune_expired", "schedule": 60.0},
}
