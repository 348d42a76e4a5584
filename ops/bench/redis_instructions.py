"""Redis instructions per job, script by script: a count that does not depend on the
machine's load, for comparing two versions of the scripts on a noisy machine.

    python ops/bench/redis_instructions.py --out after.json
    python ops/bench/redis_instructions.py --compare before.json

Starts a private redis-server under valgrind's callgrind (AOF ``everysec``, as
``carpool up`` starts it) and drives this checkout's queue straight from Python:
the four phases of ``redis_cost.py``'s scripts-alone figures (``script_phases``):
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
from pathlib import Path
from typing import Any

from redis_cost import CHUNK, script_phases  # this folder's: the same four phases

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.stack.redis_local import answers, free_port, redis_server_binary

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
    jobs -= jobs % CHUNK
    out: dict[str, Any] = {"jobs": jobs, "redis": str(r.info("server")["redis_version"])}
    for name, step in script_phases(Queue(r, Keys("instr")), jobs):
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True,
                       capture_output=True)
        step()
        subprocess.run(["callgrind_control", "-d", _trigger(name), str(pid)], check=True,
                       capture_output=True)
        out[name] = round(_dumped(folder, _trigger(name)) / jobs)
    out["total"] = sum(v for k, v in out.items() if k not in ("jobs", "redis"))
    r.close()
    return out


def _trigger(phase: str) -> str:
    """A phase's name as callgrind_control takes it (one word)."""
    return phase.replace(" ", "_")


def table(after: dict[str, Any], before: dict[str, Any] | None) -> str:
    lines = ["| phase | instructions per job |", "|---|---|"]
    for name in [k for k in after if k not in ("jobs", "redis")]:
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
