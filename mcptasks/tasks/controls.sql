-- The statements of a tool's execution controls, its retries and concurrency slots (``tasks/retries.py``,
-- ``tasks/slots.py``), which a tool without controls never runs; loaded with ``queries.sql``, in its conventions.

-- name: run_retry
-- A tool's retry: the lease given back, due at ``due``, ``tool_retry``; attempts count lost runs, not this.
WITH retried AS (
    UPDATE mcptasks_task
    SET lease_owner = '', lease_expires_at = NULL, attempts = attempts - 1, dispatched_at = %(due)s,
        status_message = %(message)s, updated_at = %(now)s
    WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(worker)s
    RETURNING id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
              result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
              dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
              started_at, finished_at, snapshot_watched, trace_context, tool_error
), recorded AS (
    INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
    SELECT id, %(now)s, %(tool_retry)s, '', '', %(actor)s, %(detail)s FROM retried
)
TABLE retried;

-- name: run_slot_wait
-- Every slot of the tool held: the task waits, unclaimed, until ``due`` (``updated_at`` on a new message).
UPDATE mcptasks_task
SET dispatched_at = %(due)s, status_message = %(message)s,
    updated_at = CASE WHEN status_message = %(message)s THEN updated_at ELSE %(now)s END
WHERE id = %(task_id)s AND status = %(working)s AND (lease_expires_at IS NULL OR lease_expires_at < %(now)s)
RETURNING id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
          result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
          dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
          started_at, finished_at, snapshot_watched, trace_context, tool_error;

-- name: slot_rows
-- A tool's concurrency slots 0..limit-1, made once.
INSERT INTO mcptasks_toolslot (tool_name, slot, task_id, worker, expires_at)
SELECT %(tool)s, n, '', '', NULL FROM generate_series(0, %(limit)s::int - 1) AS n
ON CONFLICT (tool_name, slot) DO NOTHING;

-- name: slot_take
-- A run takes a free slot of its tool (never held, released, or lapsed), skipping locked ones.
UPDATE mcptasks_toolslot SET task_id = %(task_id)s, worker = %(worker)s, expires_at = %(lease)s
WHERE id = (
    SELECT id FROM mcptasks_toolslot
    WHERE tool_name = %(tool)s AND slot < %(limit)s AND (expires_at IS NULL OR expires_at < %(now)s)
    ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED
)
RETURNING slot;

-- name: slot_renew
-- The slots of these runs follow their leases.
UPDATE mcptasks_toolslot SET expires_at = %(lease)s WHERE worker = ANY(%(workers)s);

-- name: slot_free
-- A run gives its slot back.
UPDATE mcptasks_toolslot SET task_id = '', worker = '', expires_at = NULL WHERE worker = %(worker)s;
