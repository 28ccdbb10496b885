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

local driver = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_driver.lua")
local PARKED_MS = 1000 * 1000 * 1000
local CODES = {"out_of_stock", "purchase_limit_exceeded", "sales_closed"}

function init(args)
  tokens = driver.lines_of(args[1])
  sale_id, quantity, quota = tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  math.randomseed(os.time() * 1000 + thread_id * 7919)
  granted, sent, answered = 0, 0, 0
  placed, out_of_stock, purchase_limit_exceeded, sales_closed = 0, 0, 0, 0
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
  return driver.post("/api/orders", tokens[math.random(#tokens)], body)
end

function response(status, headers, body)
  answered = answered + 1
  driver.count(status, body, CODES)
  if answered == quota then driver.finish() end
end

function done(summary, latency, requests)
  local sent, answered, placed = driver.sum("sent"), driver.sum("answered"), driver.sum("placed")
  local out_of_stock, over_limit = driver.sum("out_of_stock"), driver.sum("purchase_limit_exceeded")
  local closed = driver.sum("sales_closed")
  local errors = summary.errors
  io.write(string.format(
    'FLASH {"sent": %d, "answered": %d, "placed": %d, "out_of_stock": %d, ' ..
    '"purchase_limit_exceeded": %d, "sales_closed": %d, "other": %d, "duration_us": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "timeouts": %d, "non_2xx_3xx": %d}\n',
    sent, answered, placed, out_of_stock, over_limit, closed,
    answered - placed - out_of_stock - over_limit - closed,
    summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, errors.connect, errors.read, errors.write, errors.timeout, errors.status))
  driver.write_others()
end
