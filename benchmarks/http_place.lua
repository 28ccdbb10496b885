-- Place order for wrk (benchmarks/http_place.py drives it): every request is POST /api/orders
-- for goods no other request asks for, by a buyer taken in turn from the token file (a personal
-- token, or a service key acting for the buyer by its host id). Thread t
-- of T takes the goods on lines t, t + T, t + 2T, ... of the goods file.
--
-- Sends are counted exactly, as http_flash.lua does: wrk asks delay() before every request it
-- sends (the first on a connection too); delay() grants one per goods of the thread's share
-- until they run out or SECONDS have passed (os.time, whole seconds), then parks the
-- connection (a delay of days). Once every granted request is answered the thread stops and
-- leaves a file done-N in the working directory for the driver, so nothing is in flight at the
-- end and the database's orders are the 201s. Answers are counted by status.
--   wrk ... -s http_place.lua URL -- GOODS_FILE TOKENS_FILE THREADS SECONDS

local driver = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_driver.lua")
local PARKED_MS = 1000 * 1000 * 1000

function init(args)
  local goods, step = driver.lines_of(args[1]), tonumber(args[3])
  -- A line is a personal token, or a service key's secret, a tab and the host's user id.
  tokens, acting = {}, {}
  for i, line in ipairs(driver.lines_of(args[2])) do
    tokens[i], acting[i] = line:match("^([^\t]+)\t?(.*)$")
    if acting[i] == "" then acting[i] = nil end
  end
  stop_at = os.time() + tonumber(args[4])
  mine = {}
  for i = thread_id, #goods, step do table.insert(mine, goods[i]) end
  granted, sent, answered, placed, finished = 0, 0, 0, 0, false
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

local function place(n)
  local who = (n - 1) % #tokens + 1
  return driver.post("/api/orders", tokens[who], '{"goods_id": ' .. mine[n] .. '}', acting[who])
end

function request()
  -- wrk builds one request at start to check the script (before any delay()): not sent.
  if granted == 0 then return place(1) end
  sent = sent + 1
  return place(sent)
end

function response(status, headers, body)
  answered = answered + 1
  if status == 201 then
    placed = placed + 1
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
    'PLACE {"sent": %d, "answered": %d, "placed": %d, "non_201": {%s}, "duration_us": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "timeouts": %d}\n',
    driver.sum("sent"), driver.sum("answered"), driver.sum("placed"), table.concat(parts, ", "),
    summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, errors.connect, errors.read, errors.write, errors.timeout))
  driver.write_others()
end
