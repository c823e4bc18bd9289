-- The raw statements of mcptasks (Postgres), by name, run by ``tasks/sql.py``. Every value is a named
-- parameter (each status, state and event kind under its own name). Rows come back with their columns
-- named, never ``*`` (prepared, it breaks once a migration adds a column; ``TABLE cte`` returns the
-- CTE's list). Count slots (``*_kept``, ``*_added``) take an owner's slot no one holds, or add one.

-- name: task_lookup
-- The owner's task, with the columns a DetailedTask needs.
SELECT id, owner, tool_name, era, status, status_message, result, error,
       created_at, updated_at, ttl_ms, poll_interval_ms, outcome_read_at
FROM mcptasks_task WHERE id = %(task_id)s AND owner = %(owner)s;

-- name: task_poll
-- tasks/get: ``task_lookup``'s row, and a finished task's first read marked with its
-- ``result_retrieved`` event (a concurrent first read makes the UPDATE match nothing).
WITH found AS (
    SELECT id, owner, tool_name, era, status, status_message, result, error,
           created_at, updated_at, ttl_ms, poll_interval_ms, outcome_read_at
    FROM mcptasks_task WHERE id = %(task_id)s AND owner = %(owner)s
), marked AS (
    UPDATE mcptasks_task SET outcome_read_at = %(now)s
    WHERE id = %(task_id)s AND owner = %(owner)s
      AND status = ANY(%(terminal)s) AND outcome_read_at IS NULL
    RETURNING id, status, outcome_read_at
), recorded AS (
    INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
    SELECT id, outcome_read_at, %(result_retrieved)s, '', '', %(actor)s, jsonb_build_object('status', status)
    FROM marked
)
SELECT found.id, found.owner, found.tool_name, found.era, found.status, found.status_message,
       found.result, found.error, found.created_at, found.updated_at, found.ttl_ms,
       found.poll_interval_ms, coalesce(marked.outcome_read_at, found.outcome_read_at) AS outcome_read_at,
       marked.id IS NOT NULL AS first_read
FROM found LEFT JOIN marked ON true;

-- name: task_create
-- A new task, its answers (key -> method, params, response) and ``created`` event, counted in its owner's
-- active tasks; with a quota only below ``below``, under ``lock_key`` shared or ``quota_lock_exclusive``.
WITH total AS (
    SELECT coalesce(sum(active), 0) AS n FROM mcptasks_activetaskcount
    WHERE owner = %(owner)s AND %(below)s::int IS NOT NULL
), locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock_shared(hashtextextended(%(lock_key)s, 0)) FROM total WHERE n < %(below)s::int
), gate AS MATERIALIZED (
    SELECT %(owner)s::varchar AS owner WHERE %(below)s::int IS NULL
    UNION ALL
    SELECT %(owner)s::varchar FROM locked
), counted_kept AS (
    UPDATE mcptasks_activetaskcount SET active = active + 1
    WHERE id = (SELECT id FROM mcptasks_activetaskcount WHERE owner = (SELECT owner FROM gate)
                LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING owner
), counted_added AS (
    INSERT INTO mcptasks_activetaskcount (owner, slot, active)
    SELECT owner, mod(txid_current(), 2147483647)::int, 1 FROM gate
    WHERE NOT EXISTS (SELECT 1 FROM counted_kept)
    ON CONFLICT (owner, slot) DO UPDATE SET active = mcptasks_activetaskcount.active + EXCLUDED.active
    RETURNING owner
), counted AS (
    SELECT owner FROM counted_kept UNION ALL SELECT owner FROM counted_added
), created AS (
    INSERT INTO mcptasks_task (
        id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
        result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
        dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
        started_at, finished_at, snapshot_watched, trace_context, tool_error
    )
    SELECT %(id)s::varchar, %(owner)s::varchar, %(tool_name)s::varchar, %(arguments)s::jsonb,
           %(era)s::varchar, %(client_capabilities)s::jsonb, %(status)s::varchar,
           %(status_message)s::text, %(result)s::jsonb, %(error)s::jsonb,
           %(created_at)s::timestamptz, %(updated_at)s::timestamptz, %(ttl_ms)s::bigint,
           %(expires_at)s::timestamptz, %(poll_interval_ms)s::int, %(attempts)s::int,
           %(dispatched_at)s::timestamptz, %(lease_owner)s::varchar, %(lease_expires_at)s::timestamptz,
           %(cancel_requested_at)s::timestamptz, %(cancelled_by)s::varchar, %(outcome_read_at)s::timestamptz,
           %(started_at)s::timestamptz, %(finished_at)s::timestamptz, %(snapshot_watched)s::boolean,
           %(trace_context)s::jsonb, %(tool_error)s::boolean
    FROM counted
    RETURNING id
), answered AS (
    INSERT INTO mcptasks_inputrequest (task_id, key, method, params, response, state, created_at, answered_at)
    SELECT created.id, answer.key, answer.value ->> 'method', answer.value -> 'params', answer.value -> 'response',
           %(answered)s, %(created_at)s, %(created_at)s
    FROM created, jsonb_each(%(answers)s::jsonb) AS answer
)
INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
SELECT id, %(created_at)s, %(created)s, '', %(status)s, %(actor)s, %(detail)s FROM created;

-- name: run_claim
-- A worker leases a working task with no live lease, records ``run_started``, reads its answers.
WITH claimed AS (
    UPDATE mcptasks_task
    SET lease_owner = %(worker)s, lease_expires_at = %(lease)s, attempts = attempts + 1,
        started_at = COALESCE(started_at, %(now)s)
    WHERE id = %(task_id)s AND status = %(working)s
      AND (lease_expires_at IS NULL OR lease_expires_at < %(now)s)
    RETURNING id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
              result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
              dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
              started_at, finished_at, snapshot_watched, trace_context, tool_error
), started AS (
    INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
    SELECT id, %(now)s, %(run_started)s, '', '', %(actor)s, jsonb_build_object('attempt', attempts) FROM claimed
)
SELECT id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
       result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
       dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
       started_at, finished_at, snapshot_watched, trace_context, tool_error, (
    SELECT jsonb_object_agg(key, response) FROM mcptasks_inputrequest
    WHERE task_id = claimed.id AND state = %(answered)s
) AS answers
FROM claimed;

-- name: lease_renew
-- Heartbeats: the runs' leases renewed while working; returns the workers still holding one.
UPDATE mcptasks_task SET lease_expires_at = %(lease)s
WHERE id = ANY(%(task_ids)s) AND lease_owner = ANY(%(workers)s) AND status = %(working)s
RETURNING lease_owner;

-- name: lease_release
-- A shutting-down run gives its lease back: the attempt uncounted, the task dispatched again.
UPDATE mcptasks_task
SET lease_owner = '', lease_expires_at = NULL, attempts = attempts - 1, dispatched_at = %(now)s
WHERE id = %(task_id)s AND lease_owner = %(worker)s;

-- name: run_finish
-- A run's end under ``worker``'s lease: ``to``, result or error kept, lease cleared, event, out of the count.
WITH finished AS (
    UPDATE mcptasks_task
    SET status = %(to)s, updated_at = %(now)s, finished_at = %(now)s, status_message = %(message)s,
        result = COALESCE(%(result)s::jsonb, result), error = COALESCE(%(error)s::jsonb, error),
        lease_owner = '', lease_expires_at = NULL, tool_error = %(tool_error)s
    WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(worker)s
    RETURNING id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
              result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
              dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
              started_at, finished_at, snapshot_watched, trace_context, tool_error
), recorded AS (
    INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
    SELECT id, %(now)s, %(transition)s, %(working)s, status, %(actor)s, jsonb_build_object() FROM finished
), uncounted_kept AS (
    UPDATE mcptasks_activetaskcount SET active = active - 1
    WHERE id = (SELECT id FROM mcptasks_activetaskcount WHERE owner = (SELECT owner FROM finished)
                LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING owner
), uncounted_added AS (
    INSERT INTO mcptasks_activetaskcount (owner, slot, active)
    SELECT owner, mod(txid_current(), 2147483647)::int, -1 FROM finished
    WHERE NOT EXISTS (SELECT 1 FROM uncounted_kept)
    ON CONFLICT (owner, slot) DO UPDATE SET active = mcptasks_activetaskcount.active + EXCLUDED.active
    RETURNING owner
)
TABLE finished;

-- name: run_status_message
-- A running task's status message while ``worker`` holds the lease (no event: a hint).
UPDATE mcptasks_task SET status_message = %(message)s, updated_at = %(now)s
WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(worker)s
RETURNING id, owner, tool_name, era, status, status_message, result, error,
          created_at, updated_at, ttl_ms, poll_interval_ms, outcome_read_at;

-- name: task_end
-- An active task cancelled or failed from outside its run (with ``lapsed_at``, once its lease lapsed), from
-- ``allowed``: its event, its questions withdrawn, out of the owner's count; the row and its former status.
-- Stamped no earlier than the change it waited for: ``now`` was taken before the row lock.
WITH prior (prior_id, from_status, prior_at) AS (
    SELECT id, status, updated_at FROM mcptasks_task
    WHERE id = %(task_id)s AND status = ANY(%(allowed)s)
      AND (%(lapsed_at)s::timestamptz IS NULL OR lease_expires_at IS NULL OR lease_expires_at < %(lapsed_at)s)
    FOR UPDATE
), ended AS (
    UPDATE mcptasks_task AS task
    SET status = %(to)s, updated_at = GREATEST(%(now)s, prior_at), finished_at = GREATEST(%(now)s, prior_at),
        status_message = %(message)s, error = COALESCE(%(error)s::jsonb, task.error),
        cancel_requested_at = COALESCE(%(cancelled_at)s::timestamptz, task.cancel_requested_at),
        cancelled_by = COALESCE(%(cancelled_by)s::varchar, task.cancelled_by), lease_owner = '', lease_expires_at = NULL
    FROM prior
    WHERE task.id = prior_id AND task.status = from_status
    RETURNING id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
              result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
              dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
              started_at, finished_at, snapshot_watched, trace_context, tool_error, from_status
), recorded AS (
    INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
    SELECT id, updated_at, %(transition)s, from_status, status, %(actor)s, jsonb_build_object() FROM ended
), withdrawn AS (
    UPDATE mcptasks_inputrequest SET state = %(withdrawn)s
    WHERE task_id IN (SELECT id FROM ended WHERE from_status = %(input_required)s) AND state = %(pending)s
), uncounted_kept AS (
    UPDATE mcptasks_activetaskcount SET active = active - 1
    WHERE id = (SELECT id FROM mcptasks_activetaskcount WHERE owner = (SELECT owner FROM ended)
                LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING owner
), uncounted_added AS (
    INSERT INTO mcptasks_activetaskcount (owner, slot, active)
    SELECT owner, mod(txid_current(), 2147483647)::int, -1 FROM ended
    WHERE NOT EXISTS (SELECT 1 FROM uncounted_kept)
    ON CONFLICT (owner, slot) DO UPDATE SET active = mcptasks_activetaskcount.active + EXCLUDED.active
    RETURNING owner
)
TABLE ended;

-- name: input_request
-- A run's questions under its lease: ``input_required``, lease released, attempts reset, the event.
WITH moved AS (
    UPDATE mcptasks_task
    SET status = %(input_required)s, updated_at = %(now)s, status_message = %(message)s, attempts = 0,
        lease_owner = '', lease_expires_at = NULL
    WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(worker)s
    RETURNING id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
              result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
              dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
              started_at, finished_at, snapshot_watched, trace_context, tool_error
), asked AS (
    INSERT INTO mcptasks_inputrequest (task_id, key, method, params, state, created_at)
    SELECT moved.id, asked.key, asked.value ->> 'method', asked.value -> 'params', %(pending)s, %(now)s
    FROM moved, jsonb_each(%(requests)s::jsonb) AS asked
    ON CONFLICT (task_id, key) DO NOTHING
), recorded AS (
    INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
    SELECT id, %(now)s, %(transition)s, %(working)s, %(input_required)s, %(actor)s, %(detail)s::jsonb FROM moved
)
TABLE moved;

-- name: task_lock
-- tasks/update, first: the row locked, as every writer of its questions locks it.
SELECT status FROM mcptasks_task WHERE id = %(task_id)s FOR UPDATE;

-- name: input_pending
-- The task's questions still waiting (under ``task_lock``).
SELECT key, method, params FROM mcptasks_inputrequest WHERE task_id = %(task_id)s AND state = %(pending)s;

-- name: input_answer
-- tasks/update, last (under ``task_lock``): the answers, ``input``, and the task resumed (``resume``) or touched.
WITH answered AS (
    UPDATE mcptasks_inputrequest AS request
    SET state = %(answered)s, response = answer.value, answered_at = %(now)s
    FROM jsonb_each(%(answers)s::jsonb) AS answer
    WHERE request.task_id = %(task_id)s AND request.state = %(pending)s AND request.key = answer.key
), moved AS (
    UPDATE mcptasks_task
    SET status = CASE WHEN %(resume)s THEN %(working)s ELSE status END,
        status_message = CASE WHEN %(resume)s THEN '' ELSE status_message END,
        dispatched_at = CASE WHEN %(resume)s THEN %(now)s ELSE dispatched_at END,
        updated_at = %(now)s
    WHERE id = %(task_id)s
    RETURNING id, owner, tool_name, arguments, era, client_capabilities, status, status_message,
              result, error, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms, attempts,
              dispatched_at, lease_owner, lease_expires_at, cancel_requested_at, cancelled_by, outcome_read_at,
              started_at, finished_at, snapshot_watched, trace_context, tool_error
), recorded AS (
    INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
    SELECT %(task_id)s, %(now)s, event.kind, event.from_status, event.to_status, %(actor)s, event.detail
    FROM (VALUES (1, %(input)s::varchar, ''::varchar, ''::varchar, %(detail)s::jsonb),
                 (2, %(transition)s::varchar, %(input_required)s::varchar, %(working)s::varchar, jsonb_build_object()))
         AS event (n, kind, from_status, to_status, detail)
    WHERE event.n = 1 OR %(resume)s
    ORDER BY event.n
)
TABLE moved;

-- name: quota_lock_exclusive
-- The owner's quota lock alone: waits for every creation in flight.
SELECT pg_advisory_xact_lock(hashtextextended(%(lock_key)s, 0));
