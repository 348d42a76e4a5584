-- record.lua: not a script of its own. Scripts that read or write job records include
-- it (carpool/backend/connection.py: a line "--#include lib/record.lua").
--
-- A job's record is one string (carpool/backend/records.py): a header line of tab-separated
-- fields, "status attempts t_admit deadline owner score model bin priority digest
-- idem hook", and once ended "t_claim t_done timings batch" after them; then a newline and
-- the payload: the input while the job waits or runs, the result JSON or the error
-- message once it ended. Empty fields hold their default. The fields a claim reads
-- come first, so the hot paths read a record with one anchored match that stops
-- after them, and one plain find (a memchr) for the newline.
--
-- record_queued(rec) -> attempts, t_admit, deadline, owner, nl of a queued record (nil
--   for any other); nl is where its head ends: its input follows. Nothing else is cut
--   out of it: a claim hands the record to the worker whole (carpool/backend/records.py's
--   `claimed` splits it there)
-- record_admission(rec, attempts, nl) -> the ten fields from t_admit to hook as one
--   string, which every later write of the record keeps as is (the worker hands them
--   back with the outcome: complete.lua then writes the ended record without reading
--   the queued one)
-- record_times(head) -> t_admit, deadline of a queued record (or of its first bytes)
-- record_head(rec) -> status, attempts, admission, and where the newline is (nil: none)
-- record_fields(admission, n) -> a table of its first n fields (t_admit = 1, deadline,
--   owner, score, model, bin, priority, digest, idem = 9, hook = 10)
-- record_place(admission) -> score, model, bin: where the job waits (its bin zset)
-- ended_record(status, attempts, admission, t_claim, t_done, timings, batch, payload)
--   -> an ended record
-- requeued_record(rec, attempts) -> a queued record with its attempt count replaced
-- queued_record_parts(t_admit, deadline, owner, model, bin, priority, digest, idem, hook)
--   -> head, tail of a new queued record, never claimed: head .. score .. tail .. input
--   (admit.lua builds one per job, formatting the call's fields once)
-- record_hook(admission) -> the admission fields' last one, "hook" ("" none)
-- record_hook_of_head(rec, stop) -> the same of a record whose head ends before `stop`
--   (its newline); a job without one costs one byte compare: the byte before the head's
--   end is then the tab before it
local function record_queued(rec)
  local attempts, t_admit, deadline, owner, at = string.match(rec,
    "^queued\t(%d*)\t(%d*)\t(%d*)\t([^\t]*)()")
  if not attempts then return nil end
  return attempts, t_admit, deadline, owner, string.find(rec, "\n", at, true) or (#rec + 1)
end

local function record_admission(rec, attempts, nl)
  return string.sub(rec, #attempts + 9, nl - 1)  -- after "queued\t<attempts>\t"
end

local function record_times(head)
  return string.match(head, "^queued\t%d*\t(%d*)\t(%d*)")
end

local function record_tabs(rec)  -- where the status and the attempts fields end
  local a = string.find(rec, "\t", 1, true)
  return a, string.find(rec, "\t", a + 1, true)
end

local function record_head(rec)
  local a, b = record_tabs(rec)
  local nl = string.find(rec, "\n", b + 1, true)
  return string.sub(rec, 1, a - 1), string.sub(rec, a + 1, b - 1),
    string.sub(rec, b + 1, (nl or 0) - 1), nl
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

local function record_place(admission)
  local fields = record_fields(admission, 6)
  return fields[4], fields[5], fields[6]
end

local function ended_record(status, attempts, admission, t_claim, t_done, timings, batch,
                            payload)
  return status .. "\t" .. attempts .. "\t" .. admission .. "\t" .. t_claim .. "\t" ..
    t_done .. "\t" .. timings .. "\t" .. batch .. "\n" .. payload
end

local function requeued_record(rec, attempts)
  local _, b = record_tabs(rec)
  return "queued\t" .. attempts .. string.sub(rec, b)
end

local function queued_record_parts(t_admit, deadline, owner, model, bin, priority, digest,
                                   idem, hook)
  return "queued\t\t" .. t_admit .. "\t" .. deadline .. "\t" .. owner .. "\t",
    "\t" .. model .. "\t" .. bin .. "\t" .. priority .. "\t" .. digest .. "\t" .. idem ..
    "\t" .. hook .. "\n"
end

local function record_hook(admission)
  if #admission == 0 or string.byte(admission, -1) == 9 then return "" end
  return string.match(admission, "\t([^\t]*)$") or ""
end

local function record_hook_of_head(rec, stop)
  if stop < 2 or string.byte(rec, stop - 1) == 9 then return "" end
  return string.match(string.sub(rec, 1, stop - 1), "\t([^\t]*)$") or ""
end
