-- The ticket rush for wrk (benchmarks/http_tickets.py drives it): every request is one buyer,
-- drawn from the token file, asking for 1-4 distinct random seats of one show. Each thread has
-- its own random seed and stops after its share of attempts (leaving a file done-N in the
-- working directory for the driver); answers are counted by status
-- and, for a 409, by the error code in the body.
--   wrk ... -s http_tickets.lua URL -- TOKENS_FILE LABELS_FILE SHOW_ID ATTEMPTS_PER_THREAD

local threads = {}
local next_id = 1

function setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local function lines_of(path)
  local found = {}
  for line in io.lines(path) do
    if #line > 0 then table.insert(found, line) end
  end
  return found
end

function init(args)
  tokens, labels = lines_of(args[1]), lines_of(args[2])
  show_id, quota = tonumber(args[3]), tonumber(args[4])
  math.randomseed(os.time() * 1000 + thread_id * 7919)
  answered, placed, unavailable, over_limit, closed = 0, 0, 0, 0, 0
  others = ""
end

function request()
  local want, chosen, names = math.random(1, 4), {}, {}
  while #names < want do
    local label = labels[math.random(#labels)]
    if not chosen[label] then
      chosen[label] = true
      table.insert(names, '"' .. label .. '"')
    end
  end
  local body = '{"show_id": ' .. show_id .. ', "seats": [' .. table.concat(names, ", ") .. ']}'
  local headers = {
    ["Authorization"] = "Bearer " .. tokens[math.random(#tokens)],
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", "/api/orders", headers, body)
end

function response(status, headers, body)
  answered = answered + 1
  if status == 201 then
    placed = placed + 1
  elseif status == 409 and body:find('"seat_unavailable"', 1, true) then
    unavailable = unavailable + 1
  elseif status == 409 and body:find('"seat_limit_exceeded"', 1, true) then
    over_limit = over_limit + 1
  elseif status == 409 and body:find('"sales_closed"', 1, true) then
    closed = closed + 1
  else
    others = others .. status .. " " .. string.sub(body, 1, 120):gsub("\n", " ") .. "\n"
  end
  if answered == quota then
    -- wrk runs for its whole -d unless interrupted: tell the driver, which sends SIGINT
    -- once every thread is done (wrk then reports the time actually taken).
    wrk.thread:stop()
    local flag = io.open("done-" .. thread_id, "w")
    flag:close()
  end
end

function done(summary, latency, requests)
  local totals = {answered = 0, placed = 0, seat_unavailable = 0, seat_limit_exceeded = 0,
                  sales_closed = 0}
  local other_lines = {}
  for _, thread in ipairs(threads) do
    totals.answered = totals.answered + thread:get("answered")
    totals.placed = totals.placed + thread:get("placed")
    totals.seat_unavailable = totals.seat_unavailable + thread:get("unavailable")
    totals.seat_limit_exceeded = totals.seat_limit_exceeded + thread:get("over_limit")
    totals.sales_closed = totals.sales_closed + thread:get("closed")
    local text = thread:get("others")
    if text ~= "" then table.insert(other_lines, text) end
  end
  local errors = summary.errors
  io.write(string.format(
    'RUSH {"answered": %d, "placed": %d, "seat_unavailable": %d, "seat_limit_exceeded": %d, ' ..
    '"sales_closed": %d, "other": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "max_us": %d, "connect_errors": %d, "read_errors": %d, "write_errors": %d, ' ..
    '"timeouts": %d, "non_2xx_3xx": %d}\n',
    totals.answered, totals.placed, totals.seat_unavailable, totals.seat_limit_exceeded,
    totals.sales_closed,
    totals.answered - totals.placed - totals.seat_unavailable - totals.seat_limit_exceeded
      - totals.sales_closed,
    summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, errors.connect, errors.read, errors.write, errors.timeout, errors.status))
  for _, text in ipairs(other_lines) do io.write("OTHER " .. text) end
end
