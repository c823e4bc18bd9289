-- The statements of the sweeper, prune, expiry and the count's reconcile (``tasks/maintenance.py``,
-- ``tasks/quota.py``), off a task's hot path; loaded with ``queries.sql``, in its conventions.

-- name: run_redispatch
-- The sweeper re-enqueues a run lost while working with no live lease, with its event.
WITH moved AS (
    UPDATE mcptasks_task SET lease_owner = '', lease_expires_at = NULL, dispatched_at = %(now)s
    WHERE id = %(task_id)s AND status = %(working)s AND (lease_expires_at IS NULL OR lease_expires_at < %(now)s)
    RETURNING id
)
INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
SELECT id, %(now)s, %(redispatched)s, '', '', %(actor)s, jsonb_build_object('attempts', %(attempts)s::int) FROM moved;

-- name: task_expire
-- An operator expires a finished task now (the next prune deletes it), with its event.
WITH expired AS (
    UPDATE mcptasks_task SET expires_at = %(now)s WHERE id = %(task_id)s AND status = ANY(%(terminal)s)
    RETURNING id
)
INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
SELECT id, %(now)s, %(expired)s, '', '', %(actor)s, jsonb_build_object() FROM expired;

-- name: counts_lock_timeout
-- How long the reconcile waits for the count's writers (this transaction only).
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: counts_lock
LOCK TABLE mcptasks_activetaskcount IN EXCLUSIVE MODE;

-- name: counts_lock_timeout_reset
SET LOCAL lock_timeout TO DEFAULT;

-- name: prune_batch
-- Up to ``size`` expired terminal tasks and the rows that refer to them; held rows skipped.
WITH doomed AS (
    SELECT id FROM mcptasks_task
    WHERE status = ANY(%(terminal)s) AND expires_at < %(now)s
    ORDER BY expires_at
    LIMIT %(size)s
    FOR UPDATE SKIP LOCKED
), gone_inputs AS (
    DELETE FROM mcptasks_inputrequest WHERE task_id IN (SELECT id FROM doomed)
), gone_events AS (
    DELETE FROM mcptasks_taskevent WHERE task_id IN (SELECT id FROM doomed)
), gone_legacy AS (
    DELETE FROM mcptasks_legacytask WHERE task_id IN (SELECT id FROM doomed)
)
DELETE FROM mcptasks_task WHERE id IN (SELECT id FROM doomed);
