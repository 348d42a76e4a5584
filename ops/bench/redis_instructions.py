"""Redis instructions per job, script by script: a count that does not depend on the
machine's load, for comparing two versions of the scripts on a noisy machine.

    python ops/bench/redis_instructions.py --out after.json
    python ops/bench/redis_instructions.py --compare before.json

Starts a private redis-server under valgrind's callgrind (AOF ``everysec``, as
``carpool up`` starts it) and drives this checkout's queue straight from Python:
admission 64 jobs a call, claims and completions 32 a batch, then one read of each
result, 32 a round trip. Callgrind counts the instructions Redis executes in each
phase (zeroed before it, dumped after it); the figure is instructions per job. The
same code and inputs give the same count within a fraction of a percent whatever
else the machine runs, where CPU time on a shared 2-core VM moves by 10-20 % from
one run to the next (``redis_cost.py`` measures that end to end, through HTTP).

Instructions are not time: a cache miss costs more than an add. They rank changes
to what the scripts do (commands, fields, arguments, Lua work), not the round trips
and wake-ups around them, which only ``redis_cost.py`` sees.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from carpool.catalogue import builtin_models
from carpool.connection import connect
from carpool.jobs import Outcome, new_job_id
from carpool.keys import Keys
from carpool.queue import AdmitRequest, Queue
from carpool.redis_local import answers, free_port, redis_server_binary

#: Jobs per admission call, and per claim and completion.
ADMIT_CHUNK, BATCH = 64, 32
#: Starting Redis under valgrind takes seconds, not minutes.
START_TIMEOUT_S = 60.0


def _dumped(folder: Path, phase: str) -> int:
    """Instructions in the dump callgrind wrote for ``phase`` (its "summary:" line)."""
    for dump in sorted(folder.glob("callgrind.out.*.*")):
        text = dump.read_text(errors="replace")
        if f"Trigger: dump {phase}\n" in text:
            for line in text.splitlines():
                if line.startswith("summary:"):
                    return int(line.split()[1])
    raise RuntimeError(f"no callgrind dump for {phase} in {folder}")


def run(jobs: int) -> dict[str, Any]:
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: install valgrind (Debian: apt-get install "
                             "valgrind)")
    folder = Path(tempfile.mkdtemp(prefix="carpool-redis-instr-"))
    port = free_port()
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--dump-instr=no", redis_server_binary(),
         "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server under valgrind did not start")
            time.sleep(0.2)  # a process we started: no event to block on
        return _phases(url, proc.pid, folder, jobs)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _phases(url: str, pid: int, folder: Path, jobs: int) -> dict[str, Any]:
    r = connect(url, socket_timeout_s=60.0)
    queue = Queue(r, Keys("instr"))
    spec = builtin_models()["synthetic"]
    small = spec.bins[0]
    body = json.dumps({"value": 1, "size": 8})
    claims: list[Any] = []
    jobs -= jobs % ADMIT_CHUNK

    def admit() -> None:
        for _ in range(0, jobs, ADMIT_CHUNK):
            queue.admit_many(spec, [(small, new_job_id(spec.name), body)
                                    for _ in range(ADMIT_CHUNK)], AdmitRequest(3600))

    def claim() -> None:
        for k in range(jobs // BATCH):
            claims.append(queue.claim(spec, small.name, BATCH, lease_ms=600_000,
                                      token=f"t{k}", worker="w"))

    def complete() -> None:
        for c in claims:
            queue.complete(spec, c, [Outcome(j.id, result={"echo": 1, "checksum": "ab12"})
                                     for j in c.jobs],
                           {"size": len(c.jobs), "bin": small.name, "worker": "w"})

    def read() -> None:
        ids = [j.id for c in claims for j in c.jobs]
        for k in range(0, len(ids), BATCH):
            queue.get_many(ids[k:k + BATCH])

    out: dict[str, Any] = {"jobs": jobs, "redis": str(r.info("server")["redis_version"])}
    steps: list[tuple[str, Callable[[], None]]] = [
        ("admit", admit), ("claim", claim), ("complete", complete), ("read", read)]
    for name, step in steps:
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True,
                       capture_output=True)
        step()
        subprocess.run(["callgrind_control", "-d", name, str(pid)], check=True,
                       capture_output=True)
        out[name] = round(_dumped(folder, name) / jobs)
    out["total"] = sum(out[name] for name, _ in steps)
    r.close()
    return out


def table(after: dict[str, Any], before: dict[str, Any] | None) -> str:
    lines = ["| phase | instructions per job |", "|---|---|"]
    for name in ("admit", "claim", "complete", "read", "total"):
        if before:
            lines.append(f"| {name} | {before[name]:,} → {after[name]:,} "
                         f"({after[name] / before[name]:.2f}×) |")
        else:
            lines.append(f"| {name} | {after[name]:,} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=6016)
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument("--compare", type=Path, help="a JSON of an earlier run: before → after")
    args = ap.parse_args()
    result = run(args.jobs)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    before = json.loads(args.compare.read_text()) if args.compare else None
    print(json.dumps(result))
    print(table(result, before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
