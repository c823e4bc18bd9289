-- wrk script for the bench: POSTs MCP requests on the 2026-07-28 wire.
--
--   wrk ... -s bench/lua/mcp.lua URL -- MODE [IDS_FILE [TOKEN]]
--
-- MODE: "get"  tasks/get, rotating over the task ids in IDS_FILE (one a line);
--              with TOKEN, every request carries "Authorization: Bearer TOKEN"
--       "call" tools/call of the tool named by IDS_FILE's first line (e.g. noop)
--       "bare" POST of a constant JSON-RPC body (the floor views)
-- A reply is "bad" unless it is HTTP 200 and carries what the mode expects;
-- done() prints one JSON line with the counts and the latency percentiles.

local META = '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
  .. '"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}'
local mode = "get"
local ids = {}
local i = 0
local expect = '"taskId"'
bad = 0
local threads = {}
local base_headers = {
  ["Content-Type"] = "application/json",
  ["Accept"] = "application/json, text/event-stream",
  ["MCP-Protocol-Version"] = "2026-07-28",
}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  mode = args[1] or "get"
  if args[2] then
    for line in io.lines(args[2]) do
      if #line > 0 then ids[#ids + 1] = line end
    end
  end
  -- Each thread starts at a different place in the list.
  if #ids > 0 then i = (id * 7919) % #ids end
  if args[3] and #args[3] > 0 then base_headers["Authorization"] = "Bearer " .. args[3] end
  if mode == "bare" then expect = '"result"' end
  if mode == "call" then expect = '"resultType":"task"' end
end


function request()
  if mode == "get" then
    i = i % #ids + 1
    local tid = ids[i]
    local h = {}
    for k, v in pairs(base_headers) do h[k] = v end
    h["Mcp-Method"] = "tasks/get"
    h["Mcp-Name"] = tid
    local body = '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"' .. tid .. '",' .. META .. '}}'
    return wrk.format("POST", nil, h, body)
  elseif mode == "call" then
    local name = ids[1]
    local h = {}
    for k, v in pairs(base_headers) do h[k] = v end
    h["Mcp-Method"] = "tools/call"
    h["Mcp-Name"] = name
    local body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"' .. name
      .. '","arguments":{},' .. META .. '}}'
    return wrk.format("POST", nil, h, body)
  else
    return wrk.format("POST", nil, base_headers, '{"jsonrpc":"2.0","id":1,"method":"ping"}')
  end
end

function response(status, headers, body)
  if status ~= 200 or not string.find(body, expect, 1, true) then
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local nbad = 0
  for _, t in ipairs(threads) do nbad = nbad + (t:get("bad") or 0) end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"bad":%d,'
      .. '"err_connect":%d,"err_read":%d,"err_write":%d,"err_status":%d,"err_timeout":%d,'
      .. '"lat_mean_us":%.1f,"lat_p50_us":%d,"lat_p90_us":%d,"lat_p99_us":%d,"lat_p999_us":%d,"lat_max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, nbad,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
