"""The Celery side: the jobs, a task run (execution), broker hardening, the
beat schedule, the all-in-one runner, and the dispatch that sends a run to a
worker."""
