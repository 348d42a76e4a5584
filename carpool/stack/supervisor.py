"""Keep the local stack's processes running, as a process manager would.

A child that exits is restarted after an exponential backoff, with a log line that
names it, says how it ended, quotes its last log lines and counts its restarts; the
other children keep serving. Only a crash loop (``CRASH_LOOP_EXITS`` exits within
``CRASH_LOOP_WINDOW_S``) stops the stack, with the child's last log lines.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: A child that exits this many times within the window is crash-looping: stop.
CRASH_LOOP_EXITS = 5
CRASH_LOOP_WINDOW_S = 60.0
#: Restart backoff: the first restart after this, doubling per recent exit, capped.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 1.0, 30.0
#: How often the supervisor looks at its children (a Popen offers no exit event).
POLL_S = 0.2
#: Log lines quoted when a child exits, and when it crash-loops.
TAIL_LINES_EXIT, TAIL_LINES_CRASH_LOOP = 3, 15


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log file ("(empty log)" if none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def how_it_ended(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


@dataclass
class Child:
    """One supervised process: how to start it, and its recent exits."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exits: deque[float] = field(default_factory=deque)  # monotonic times, in the window
    restart_at: float | None = None
    #: Told to stop for good (carpool up's autoscaler): not restarted, removed once it exits.
    retiring: bool = False

    def start(self) -> None:
        # The child keeps its own copy of the descriptor; ours closes at once.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT)

    def backoff_s(self, first_s: float) -> float:
        return float(min(BACKOFF_MAX_S, first_s * 2 ** max(0, len(self.exits) - 1)))


class Supervisor:
    """Restarts children that exit, from one thread; ``failure`` says why it gave up."""

    def __init__(self, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 backoff_first_s: float = BACKOFF_FIRST_S) -> None:
        self.children: list[Child] = []
        self.backoff_first_s = backoff_first_s
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.clock = clock
        self.failure: str | None = None
        self.failed = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, child: Child) -> None:
        with self._lock:
            child.start()
            self.children.append(child)

    def retire(self, name: str) -> None:
        """Stop a child for good with SIGTERM (a worker's warm shutdown: it finishes its
        batch and hands back what it claimed). Never SIGKILL: a worker past its own stop
        grace hands its batch back itself (worker/shell/bootstep.py)."""
        with self._lock:
            for child in self.children:
                if child.name == name and not child.retiring:
                    child.retiring = True
                    if child.proc is not None and child.proc.poll() is None:
                        child.proc.send_signal(signal.SIGTERM)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="carpool-supervisor",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(POLL_S):
            with self._lock:
                if self._stopping.is_set():
                    return
                self.check()
            if self.failed.is_set():
                return

    def check(self) -> None:
        """Note exits, restart children whose backoff has passed, detect crash loops."""
        if self._stopping.is_set():
            return  # stopping: a child exiting now was told to
        now = self.clock()
        for child in list(self.children):
            code = child.proc.poll() if child.proc is not None else None
            if child.retiring:
                if code is not None:
                    self.children.remove(child)
                    self.say(f"{child.name} stopped ({how_it_ended(code)})")
                continue
            if child.restart_at is None and code is not None:
                self._exited(child, code, now)
            if (child.restart_at is not None and now >= child.restart_at and not self.failure
                    and not self._stopping.is_set()):
                child.restart_at = None
                child.restarts += 1
                child.start()
                pid = child.proc.pid if child.proc else "?"
                self.say(f"{child.name} restarted (restart #{child.restarts}, pid {pid})")

    def _exited(self, child: Child, code: int, now: float) -> None:
        child.exits.append(now)
        while child.exits and now - child.exits[0] > CRASH_LOOP_WINDOW_S:
            child.exits.popleft()
        if len(child.exits) >= CRASH_LOOP_EXITS:
            self.failure = (
                f"{child.name} {how_it_ended(code)}, its {len(child.exits)}th exit within "
                f"{CRASH_LOOP_WINDOW_S:.0f} s: stopping (crash loop). Its last log lines "
                f"({child.log_path}):\n{tail(child.log_path, TAIL_LINES_CRASH_LOOP)}")
            self.failed.set()
            return
        backoff_s = child.backoff_s(self.backoff_first_s)
        child.restart_at = now + backoff_s
        self.say(f"{child.name} {how_it_ended(code)}; restarting in {backoff_s:.1f} s "
                 f"(exit {len(child.exits)} within {CRASH_LOOP_WINDOW_S:.0f} s). Last log "
                 f"lines ({child.log_path}):\n{tail(child.log_path, TAIL_LINES_EXIT)}")

    def running(self) -> list[subprocess.Popen[bytes]]:
        return [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]

    def hold(self) -> None:
        """No more restarts from now on (safe from a signal handler: takes no lock)."""
        self._stopping.set()

    def stop(self) -> None:
        """No more restarts, and the thread has ended (the caller then stops the children)."""
        with self._lock:
            self._stopping.set()
        if self._thread is not None:
            self._thread.join()
