-- record.lua: not a script of its own. Scripts that read or write job records include
-- it (carpool/connection.py: a line "--#include record").
--
-- A job's record is one string (carpool/records.py): a header line of tab-separated
-- fields, "status attempts t_admit deadline owner score model bin priority digest
-- idem", and once ended "t_claim t_done timings batch" after them; then, ended, a
-- newline and the payload (result JSON, or error message). Empty fields hold their
-- default. The input is a key of its own, {p.s}:in:<id>, from admission to the end.
-- The fields a claim reads come first, and fields are found with plain string.find
-- (a memchr): a Lua pattern over the record costs several times more per job.
--
-- record_head(rec) -> status, attempts, admission: admission is the nine fields from
--   t_admit to idem as one string (of a queued record, whose head is all it holds),
--   which every later write of the record keeps as is.
-- record_claimed(rec) -> status, attempts, t_admit, deadline, owner (strings)
-- record_fields(admission, n) -> a table of its first n fields (t_admit = 1, deadline,
--   owner, score, model, bin, priority, digest, idem = 9)
-- ended_record(status, attempts, admission, t_claim, t_done, timings, batch, payload)
--   -> the ended record of a queued one
-- input_prefix(job_prefix) -> "{p.s}:in:" from "{p.s}:job:"
local function record_head(rec)
  local a = string.find(rec, "\t", 1, true)
  local b = string.find(rec, "\t", a + 1, true)
  local stop = -1
  if string.sub(rec, 1, a - 1) ~= "queued" then  -- an ended record: its head ends at "\n"
    stop = (string.find(rec, "\n", b + 1, true) or 0) - 1
  end
  return string.sub(rec, 1, a - 1), string.sub(rec, a + 1, b - 1), string.sub(rec, b + 1, stop)
end

local function record_claimed(rec)
  local a = string.find(rec, "\t", 1, true)
  local b = string.find(rec, "\t", a + 1, true)
  local c = string.find(rec, "\t", b + 1, true)
  local d = string.find(rec, "\t", c + 1, true)
  local e = string.find(rec, "\t", d + 1, true)
  return string.sub(rec, 1, a - 1), string.sub(rec, a + 1, b - 1), string.sub(rec, b + 1, c - 1),
    string.sub(rec, c + 1, d - 1), string.sub(rec, d + 1, e - 1)
end

local function record_fields(admission, n)
  local out, at = {}, 1
  for k = 1, n do
    local stop = string.find(admission, "\t", at, true)
    if not stop then
      out[k] = string.sub(admission, at)
      break
    end
    out[k] = string.sub(admission, at, stop - 1)
    at = stop + 1
  end
  return out
end

local function ended_record(status, attempts, admission, t_claim, t_done, timings, batch,
                            payload)
  return status .. "\t" .. attempts .. "\t" .. admission .. "\t" .. t_claim .. "\t" ..
    t_done .. "\t" .. timings .. "\t" .. batch .. "\n" .. payload
end

local function input_prefix(job_prefix)
  return (string.gsub(job_prefix, "}:job:$", "}:in:"))
end
