"""Each format that crosses Python <-> Lua round-trips both ways on a real Redis: what
carpool/core/wire.py (or carpool/backend/records.py) encodes, the Lua fragments
(lua/lib/wire.lua, lua/lib/record.lua) decode field by field, in a tiny script that
includes them; and what the fragments encode, Python decodes."""

from __future__ import annotations

from typing import Any

import redis

from carpool.backend import records
from carpool.backend.connection import expand_includes
from carpool.backend.outbox import Outbox
from carpool.backend.queue import Queue
from carpool.core.shards import shard
from carpool.core.wire import (
    CompletionHook,
    Family,
    HookField,
    OutboxEvent,
    UsageLine,
    encode_completion_hooks,
    encode_usage,
)
from tests.support.jobs import admit, synthetic

URL = "https://example.com/h?a=1&b=%20"


def run_lua(client: redis.Redis, body: str, *args: str | int) -> Any:
    """``body`` run as a script with both fragments pasted in (no keys: nothing stored)."""
    source = "--#include lib/wire.lua\n--#include lib/record.lua\n" + body
    return client.eval(expand_includes(source), 0, *args)


def test_a_hook_field_python_encodes_is_what_the_lua_fragment_decodes(
        client: redis.Redis) -> None:
    field = HookField(("running", "failed", "cancelled"), URL).encode()
    got = run_lua(client, "local l, u = wire_hook_decode(ARGV[1]); return {l, u}", field)
    assert got == ["rfc", URL]
    assert run_lua(client, "return wire_hook_decode(ARGV[1]) == nil and 1 or 0", "") == 1


def test_an_outbox_event_round_trips_python_to_lua_and_lua_to_python(
        client: redis.Redis) -> None:
    sent = OutboxEvent("0a-job-1", "expired", 1_700_000_000_123, "f" * 64, URL)
    got = run_lua(client, "return {wire_event_decode(ARGV[1])}", sent.encode())
    assert got == ["0a-job-1", "expired", "1700000000123", "f" * 64, URL]
    member = run_lua(client, "return wire_event_encode(ARGV[1], ARGV[2], ARGV[3], ARGV[4], "
                             "ARGV[5])", "0a-job-2", "done", 42, "", URL)
    assert OutboxEvent.decode(member) == OutboxEvent("0a-job-2", "done", 42, "", URL)


def test_completion_hooks_python_encodes_are_what_the_lua_fragment_iterates(
        client: redis.Redis) -> None:
    hooks = [CompletionHook(1, "done", "o" * 64, f"d {URL}"),
             CompletionHook(3, "failed", "", f"rdf {URL}")]
    got = run_lua(client, """
local out = {}
for k, letter, owner, hook in wire_completion_hooks(ARGV[1]) do
  out[#out + 1] = {k, letter, owner, hook}
end
return out""", encode_completion_hooks(hooks))
    assert got == [[1, "d", "o" * 64, f"d {URL}"], [3, "f", "", f"rdf {URL}"]]


def test_a_record_round_trips_python_to_lua_and_lua_to_python(client: redis.Redis) -> None:
    hook = HookField(("done",), URL).encode()
    fields: dict[str, str | int] = {
        "status": "queued", "attempts": 2, "t_admit": 1000, "deadline": 5000,
        "owner": "o" * 16, "score": 77, "model": "m", "bin": "b", "priority": 3,
        "digest": "d" * 16, "idem": "{p.0}:idem:m:k", "hook": hook}
    built = records.build(fields, '{"x": "\t"}')
    got = run_lua(client, """
local status, attempts, admission, nl = record_head(ARGV[1])
local f = record_fields(admission, 9)
return {status, attempts, f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9],
  record_hook(admission), record_hook_of_head(ARGV[1], nl), string.sub(ARGV[1], nl + 1)}""",
                  built)
    assert got == ["queued", "2", "1000", "5000", "o" * 16, "77", "m", "b", "3", "d" * 16,
                   "{p.0}:idem:m:k", hook, hook, '{"x": "\t"}']
    written = run_lua(client, """
local head, tail = queued_record_parts(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
  ARGV[7], ARGV[8], ARGV[9])
return head .. ARGV[10] .. tail .. ARGV[11]""", 1000, "", "", "m", "b", "", "", "", hook, 77,
                      "{}")
    assert records.parse(written) == {"status": "queued", "t_admit": "1000", "score": "77",
                                      "model": "m", "bin": "b", "hook": hook, "input": "{}"}
    assert HookField.decode(records.parse(written)["hook"]) == HookField(("done",), URL)


def test_an_event_a_script_adds_is_one_python_decodes_as_a_jobs(queue: Queue) -> None:
    """cancel.lua adds the job's event through lib/outbox.lua; the dispatcher's take reads
    it back typed, a job's by the outbox it came from."""
    spec = synthetic()
    job = admit(queue, spec, hook=HookField(("cancelled",), URL).encode())
    queue.cancel(job, 60)
    (event,) = Outbox(queue.client, queue.keys).take(shard(spec.name), 10, 5000).events
    assert (event.job_id, event.event, event.url, event.family) == (
        job, "cancelled", URL, Family.JOB)
    assert OutboxEvent.decode(event.member).subject_id == job


def test_usage_lines_python_encodes_are_what_the_lua_fragment_iterates(
        client: redis.Redis) -> None:
    lines = [UsageLine("o" * 64, ((1, 1250, 7), (3, 2500, 9))), UsageLine("", ((2, 0, 4),))]
    got = run_lua(client, """
local out = {}
for owner, jobs, device_us, queue_ms, each in wire_usage_lines(ARGV[1]) do
  local seen = {}
  for k, d, q in wire_usage_each(each) do seen[#seen + 1] = k .. "/" .. d .. "/" .. q end
  out[#out + 1] = {owner, jobs, device_us, queue_ms, table.concat(seen, ",")}
end
return out""", encode_usage(lines))
    assert got == [["o" * 64, 2, 3750, 16, "1/1250/7,3/2500/9"], ["", 1, 0, 4, "2/0/4"]]
