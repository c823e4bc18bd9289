"""The public path of the periodic maintenance schedule, importable from
settings (it loads no models)::

    from mcptasks.beat import BEAT_SCHEDULE

The schedule lives in ``mcptasks.worker.beat``.
"""

from .worker.beat import BEAT_SCHEDULE

__all__ = ["BEAT_SCHEDULE"]
