"""Structured logs for the audit trail.

The ``mcptasks.lifecycle`` logger has one line per committed change (creation, every
transition, a retry) and ``mcptasks.audit`` one per read of a finished
task's outcome; each record carries its fields as attributes (``task_id``,
``kind``, ``from_status``, ``to_status``, ``actor``, ...). ``JsonFormatter``
writes them as one JSON object per line::

    LOGGING = {
        "version": 1,
        "formatters": {"json": {"()": "mcptasks.audit.JsonFormatter"}},
        "handlers": {"audit": {"class": "logging.StreamHandler", "formatter": "json"}},
        "loggers": {
            "mcptasks.lifecycle": {"handlers": ["audit"], "level": "INFO", "propagate": False},
            "mcptasks.audit": {"handlers": ["audit"], "level": "INFO", "propagate": False},
        },
    }
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

#: Attributes every ``LogRecord`` has; anything else came from ``extra=``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and every
    field passed with ``extra=`` (values that JSON cannot hold become strings)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)
