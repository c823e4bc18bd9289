"""The domain: a task's life in the database.

Creation with the per-owner quota, guarded transitions, runs and their
leases, maintenance, operator actions and audit. Nothing here imports
Celery, Channels or HTTP: a run leaves for a worker through the dispatch
seam (``mcptasks.tasks.dispatch``) that the worker layer fills, and changes
reach listeners through ``mcptasks.signals``.
"""
