-- The flash sale for wrk (benchmarks/http_flash.py drives it): every request is one buyer,
-- drawn from the token file, asking for QUANTITY units of one flash sale.
--
-- Attempts are counted exactly: wrk asks delay() before every request it sends (the first on a
-- connection too), so delay() hands out the thread's ATTEMPTS_PER_THREAD sends and parks every
-- connection after that (a delay of days); the thread stops when its last granted request is
-- answered, so nothing is left in flight. request() counts what was really sent (a resend after
-- a socket error would show as sent > granted; the one request wrk builds at start to check the
-- script comes before any delay() and is not counted). Each thread leaves a file done-N in the working
-- directory for the driver; answers are counted by status and, for a 409, by its error code.
--   wrk ... -s http_flash.lua URL -- TOKENS_FILE FLASH_SALE_ID QUANTITY ATTEMPTS_PER_THREAD

local threads = {}
local next_id = 1
local PARKED_MS = 1000 * 1000 * 1000

function setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  tokens = {}
  for line in io.lines(args[1]) do
    if #line > 0 then table.insert(tokens, line) end
  end
  sale_id, quantity, quota = tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  math.randomseed(os.time() * 1000 + thread_id * 7919)
  granted, sent, answered = 0, 0, 0
  placed, out_of_stock, over_limit, closed = 0, 0, 0, 0
  others = ""
  body = '{"flash_sale_id": ' .. sale_id .. ', "quantity": ' .. quantity .. '}'
end

function delay()
  if granted < quota then
    granted = granted + 1
    return 0
  end
  return PARKED_MS
end

function request()
  -- wrk builds one request at start to check the script (before any delay()): not sent.
  if granted > 0 then sent = sent + 1 end
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
  elseif status == 409 and body:find('"out_of_stock"', 1, true) then
    out_of_stock = out_of_stock + 1
  elseif status == 409 and body:find('"purchase_limit_exceeded"', 1, true) then
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
  local totals = {sent = 0, answered = 0, placed = 0, out_of_stock = 0,
                  purchase_limit_exceeded = 0, sales_closed = 0}
  local other_lines = {}
  for _, thread in ipairs(threads) do
    totals.sent = totals.sent + thread:get("sent")
    totals.answered = totals.answered + thread:get("answered")
    totals.placed = totals.placed + thread:get("placed")
    totals.out_of_stock = totals.out_of_stock + thread:get("out_of_stock")
    totals.purchase_limit_exceeded = totals.purchase_limit_exceeded + thread:get("over_limit")
    totals.sales_closed = totals.sales_closed + thread:get("closed")
    local text = thread:get("others")
    if text ~= "" then table.insert(other_lines, text) end
  end
  local errors = summary.errors
  io.write(string.format(
    'FLASH {"sent": %d, "answered": %d, "placed": %d, "out_of_stock": %d, ' ..
    '"purchase_limit_exceeded": %d, "sales_closed": %d, "other": %d, "duration_us": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "timeouts": %d, "non_2xx_3xx": %d}\n',
    totals.sent, totals.answered, totals.placed, totals.out_of_stock,
    totals.purchase_limit_exceeded, totals.sales_closed,
    totals.answered - totals.placed - totals.out_of_stock - totals.purchase_limit_exceeded
      - totals.sales_closed,
    summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, errors.connect, errors.read, errors.write, errors.timeout, errors.status))
  for _, text in ipairs(other_lines) do io.write("OTHER " .. text) end
end
