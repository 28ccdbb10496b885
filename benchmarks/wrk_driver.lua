-- What the HTTP benchmarks' wrk scripts share (http_place.lua, http_flash.lua,
-- http_tickets.lua): the threads' ids, reading a file of lines (tokens, ids, seat labels), the
-- headers of a buyer's POST, telling the driver a thread is done, keeping unexpected answers
-- and summing the threads' counters. A script loads it with
--   local driver = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_driver.lua")
-- and keeps only what it asks and how it counts the answers.

local driver = {threads = {}}
local next_id = 1

-- wrk calls setup() in its main state once per thread: each thread gets thread_id 1, 2, ...
function setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
  table.insert(driver.threads, thread)
end

function driver.lines_of(path)
  local found = {}
  for line in io.lines(path) do
    if #line > 0 then table.insert(found, line) end
  end
  return found
end

function driver.post(path, token, body, act_as)
  local headers = {
    ["Authorization"] = "Bearer " .. token,
    ["Content-Type"] = "application/json",
  }
  -- A service key names the host's user it acts for.
  if act_as then headers["Dueflow-Act-As"] = act_as end
  return wrk.format("POST", path, headers, body)
end

-- Stop this thread and leave a file done-N in the working directory: wrk runs for its whole -d
-- unless interrupted, so the driver sends SIGINT once every thread is done (wrk then reports
-- the time actually taken).
function driver.finish()
  wrk.thread:stop()
  local flag = io.open("done-" .. thread_id, "w")
  flag:close()
end

-- Keep an unexpected answer (the thread's global `others`, up to about 2,000 characters).
function driver.other(status, body)
  if #others < 2000 then
    others = others .. status .. " " .. string.sub(body, 1, 120):gsub("\n", " ") .. "\n"
  end
end

-- Count one answer: a 201 in the thread's global `placed`, a 409 whose body names one of
-- `codes` (error codes, in the order to look for them) in the global of that code's name,
-- anything else kept by driver.other.
function driver.count(status, body, codes)
  if status == 201 then
    placed = placed + 1
    return
  end
  if status == 409 then
    for _, code in ipairs(codes) do
      if body:find('"' .. code .. '"', 1, true) then
        _G[code] = _G[code] + 1
        return
      end
    end
  end
  driver.other(status, body)
end

-- The sum of one counter over every thread.
function driver.sum(name)
  local total = 0
  for _, thread in ipairs(driver.threads) do total = total + thread:get(name) end
  return total
end

-- Every thread's unexpected answers, one OTHER line each.
function driver.write_others()
  for _, thread in ipairs(driver.threads) do
    local text = thread:get("others")
    if text ~= "" then io.write("OTHER " .. text) end
  end
end

return driver
