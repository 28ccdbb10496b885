-- The ticket rush for wrk (benchmarks/http_tickets.py drives it): every request is one buyer,
-- drawn from the token file, asking for 1-4 distinct random seats of one show. Each thread has
-- its own random seed and stops after its share of attempts (leaving a file done-N in the
-- working directory for the driver); answers are counted by status
-- and, for a 409, by the error code in the body.
--   wrk ... -s http_tickets.lua URL -- TOKENS_FILE LABELS_FILE SHOW_ID ATTEMPTS_PER_THREAD

local driver = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_driver.lua")
local CODES = {"seat_unavailable", "seat_limit_exceeded", "sales_closed"}

function init(args)
  tokens, labels = driver.lines_of(args[1]), driver.lines_of(args[2])
  show_id, quota = tonumber(args[3]), tonumber(args[4])
  math.randomseed(os.time() * 1000 + thread_id * 7919)
  answered, placed, seat_unavailable, seat_limit_exceeded, sales_closed = 0, 0, 0, 0, 0
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
  return driver.post("/api/orders", tokens[math.random(#tokens)], body)
end

function response(status, headers, body)
  answered = answered + 1
  driver.count(status, body, CODES)
  if answered == quota then driver.finish() end
end

function done(summary, latency, requests)
  local answered, placed = driver.sum("answered"), driver.sum("placed")
  local unavailable, over_limit = driver.sum("seat_unavailable"), driver.sum("seat_limit_exceeded")
  local closed = driver.sum("sales_closed")
  local errors = summary.errors
  io.write(string.format(
    'RUSH {"answered": %d, "placed": %d, "seat_unavailable": %d, "seat_limit_exceeded": %d, ' ..
    '"sales_closed": %d, "other": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "max_us": %d, "connect_errors": %d, "read_errors": %d, "write_errors": %d, ' ..
    '"timeouts": %d, "non_2xx_3xx": %d}\n',
    answered, placed, unavailable, over_limit, closed,
    answered - placed - unavailable - over_limit - closed,
    summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, errors.connect, errors.read, errors.write, errors.timeout, errors.status))
  driver.write_others()
end
