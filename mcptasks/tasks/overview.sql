-- The admin's statements (``tasks/overview.py``, ``admin.py``); loaded with ``queries.sql``, in its conventions.

-- name: table_size_estimate
-- The planner's estimate of a table's rows (-1: never analyzed).
SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%(table)s);

-- name: overview_gauges
-- The active total (the counter's slots) and the waiting tasks up to ``cap``, one snapshot.
SELECT (SELECT COALESCE(SUM(active), 0) FROM mcptasks_activetaskcount),
       (SELECT COUNT(*) FROM (SELECT 1 FROM mcptasks_task WHERE status = %(input_required)s LIMIT %(cap)s) AS waiting);

-- name: overview_settings
-- For the grouped scans (this transaction only): no JIT, sorts in memory.
SELECT set_config('jit', 'off', true), set_config('work_mem', %(work_mem)s, true);

-- name: overview_created
-- Tasks created in [start, end), per bucket of ``step`` seconds and overall (bucket null):
-- counts by status in ``CREATED_STATUSES`` order, p50/p95 of their queue wait.
SELECT bucket,
       COUNT(*) FILTER (WHERE status = %(working)s), COUNT(*) FILTER (WHERE status = %(input_required)s),
       COUNT(*) FILTER (WHERE status = %(completed)s), COUNT(*) FILTER (WHERE status = %(failed)s),
       COUNT(*) FILTER (WHERE status = %(cancelled)s),
       COUNT(seconds), percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY seconds)
FROM (
    SELECT floor(date_part('epoch', created_at - %(start)s::timestamptz) / %(step)s::float8)::int AS bucket, status,
           date_part('epoch', COALESCE(started_at, finished_at, %(now)s::timestamptz) - created_at) AS seconds
    FROM mcptasks_task
    WHERE created_at >= %(start)s::timestamptz AND created_at < %(end)s::timestamptz
) AS timed
GROUP BY GROUPING SETS ((bucket), ());

-- name: overview_finished
-- Tasks finished in the window, as ``overview_created``: by terminal status, p50/p95 run time.
SELECT bucket,
       COUNT(*) FILTER (WHERE status = %(completed)s), COUNT(*) FILTER (WHERE status = %(failed)s),
       COUNT(*) FILTER (WHERE status = %(cancelled)s),
       COUNT(seconds), percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY seconds)
FROM (
    SELECT floor(date_part('epoch', finished_at - %(start)s::timestamptz) / %(step)s::float8)::int AS bucket, status,
           date_part('epoch', finished_at - started_at) AS seconds
    FROM mcptasks_task
    WHERE finished_at >= %(start)s::timestamptz AND finished_at < %(end)s::timestamptz
) AS timed
GROUP BY GROUPING SETS ((bucket), ());

-- name: overview_failures
-- Tasks that failed in the window, by tool: protocol failures and tool errors.
SELECT tool_name, COUNT(*) FILTER (WHERE NOT tool_error), COUNT(*) FILTER (WHERE tool_error) FROM mcptasks_task
WHERE finished_at >= %(start)s AND finished_at < %(end)s AND (status = %(failed)s OR tool_error)
GROUP BY 1;

-- name: overview_queue_wait
-- Tasks created in the window: p50/p95 queue wait by their tool's queue (``tools``/``queues``
-- pair them; any other tool goes to ``default``).
SELECT COALESCE(routes.queue, %(default)s) AS queue, COUNT(seconds),
       percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY seconds)
FROM (
    SELECT tool_name,
           date_part('epoch', COALESCE(started_at, finished_at, %(now)s::timestamptz) - created_at) AS seconds
    FROM mcptasks_task
    WHERE created_at >= %(start)s::timestamptz AND created_at < %(end)s::timestamptz
) AS timed
LEFT JOIN unnest(%(tools)s::text[], %(queues)s::text[]) AS routes (tool, queue) ON routes.tool = timed.tool_name
GROUP BY 1
ORDER BY 1;
