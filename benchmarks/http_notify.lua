-- Payment notifications for wrk (benchmarks/http_notify.py drives it): every request is one of
-- the simulator's signed notifications, sent once, each paying an order no other request pays.
-- A line of the requests file is the path, the body in hex and the headers, tab separated:
--   PATH \t BODY_HEX \t NAME \t VALUE \t NAME \t VALUE ...
-- Thread t of T takes the lines t, t + T, t + 2T, ... and builds its requests once, in init.
--
-- Sends are counted exactly, as http_place.lua does: delay() grants one request per
-- notification of the thread's share until they run out or SECONDS have passed (os.time, whole
-- seconds), then parks the connection; once every granted request is answered the thread stops
-- and leaves a file done-N for the driver, so nothing is in flight at the end and the inbox
-- holds exactly the answered notifications. Answers are counted by status: 2xx are accepted.
--   wrk ... -s http_notify.lua URL -- REQUESTS_FILE THREADS SECONDS

local driver = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_driver.lua")
local PARKED_MS = 1000 * 1000 * 1000

local function unhex(text)
  return (text:gsub("..", function(pair) return string.char(tonumber(pair, 16)) end))
end

local function built(line)
  local fields = {}
  for field in (line .. "\t"):gmatch("([^\t]*)\t") do table.insert(fields, field) end
  local headers = {}
  for i = 3, #fields - 1, 2 do headers[fields[i]] = fields[i + 1] end
  return wrk.format("POST", fields[1], headers, unhex(fields[2]))
end

function init(args)
  local lines, step = driver.lines_of(args[1]), tonumber(args[2])
  stop_at = os.time() + tonumber(args[3])
  mine = {}
  for i = thread_id, #lines, step do table.insert(mine, built(lines[i])) end
  granted, sent, answered, accepted, finished = 0, 0, 0, 0, false
  counts, statuses, others = {}, "", ""
end

local function finish_when_answered()
  if not finished and answered == granted then
    finished = true
    driver.finish()
  end
end

function delay()
  if granted < #mine and os.time() < stop_at then
    granted = granted + 1
    return 0
  end
  finish_when_answered()
  return PARKED_MS
end

function request()
  -- wrk builds one request at start to check the script (before any delay()): not sent.
  if granted == 0 then return mine[1] or wrk.format("GET", "/healthz") end
  sent = sent + 1
  return mine[sent]
end

function response(status, headers, body)
  answered = answered + 1
  if status >= 200 and status < 300 then
    accepted = accepted + 1
  else
    counts[status] = (counts[status] or 0) + 1
    local parts = {}
    for code, count in pairs(counts) do table.insert(parts, code .. "=" .. count) end
    statuses = table.concat(parts, ",")
    driver.other(status, body)
  end
  if granted == #mine or os.time() >= stop_at then finish_when_answered() end
end

function done(summary, latency, requests)
  local other = {}
  for _, thread in ipairs(driver.threads) do
    for code, count in string.gmatch(thread:get("statuses"), "(%d+)=(%d+)") do
      other[code] = (other[code] or 0) + tonumber(count)
    end
  end
  local parts = {}
  for code, count in pairs(other) do table.insert(parts, '"' .. code .. '": ' .. count) end
  local errors = summary.errors
  io.write(string.format(
    'NOTIFY {"sent": %d, "answered": %d, "accepted": %d, "non_2xx": {%s}, "duration_us": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "timeouts": %d}\n',
    driver.sum("sent"), driver.sum("answered"), driver.sum("accepted"), table.concat(parts, ", "),
    summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, errors.connect, errors.read, errors.write, errors.timeout))
  driver.write_others()
end
