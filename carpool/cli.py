"""carpool: a job queue for batched, asynchronous model inference.

Each command has its own --help.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carpool.client import ApiError, Client, Job
from carpool.client.bulk import run_bulk_command
from carpool.client.cli_commands import add_commands
from carpool.core.clihelp import HelpParser
from carpool.core.errors import CarpoolError
from carpool.stack.autoscaler import Autoscaler
from carpool.stack.localstack import DEFAULT_FLOWER_PORT, DEFAULT_WEB_PORT, UpOptions, start_stack
from carpool.stack.readiness import report_until_ready
from carpool.stack.scaling import parse_workers
from carpool.stack.supervisor import Supervisor
from carpool.stack.waiting import wait_until

if TYPE_CHECKING:  # imported where used: the client commands need no Redis
    from carpool.backend.keys import Keys
    from carpool.backend.outbox import Outbox

DEFAULT_URL = "http://127.0.0.1:8000"
#: The demo long-polls this long at most (a first start warms models up first), in
#: polls of DEMO_POLL_S, so a child that crash-loops meanwhile is reported at once.
DEMO_TIMEOUT_S, DEMO_POLL_S = 180.0, 5
#: The demo's image goes to the built-in classifier whose weights a pip package ships.
DEMO_IMAGE_MODEL, DEMO_IMAGE_PX = "efficientnet_lite0", 256
#: How long `carpool up` waits for the web tier to answer /readyz, asking this often.
READY_TIMEOUT_S, READY_POLL_S = 60.0, 0.2


def _print(obj: object) -> None:
    print(json.dumps(obj, indent=2))


def _check(supervisor: Supervisor) -> None:
    if supervisor.failure:
        raise CarpoolError(supervisor.failure)


def _wait_ready(base_url: str, supervisor: Supervisor) -> None:
    # Polling a process we just started (it has no event to offer); a child that
    # dies meanwhile is reported by the supervisor at once, with its log lines.
    try:
        with Client(base_url) as client:
            wait_until(client.ready, READY_TIMEOUT_S, f"web at {base_url}",
                       check=lambda: _check(supervisor), pause=supervisor.failed.wait,
                       poll_s=READY_POLL_S)
    except TimeoutError:
        raise CarpoolError(f"web did not become ready at {base_url} within "
                           f"{READY_TIMEOUT_S:.0f} s") from None


def _follow(client: Client, job: Job, supervisor: Supervisor) -> Job:
    # The first start of a worker loads and calibrates every model it serves before
    # its first batch, so the demo keeps long-polling, within a bound.
    deadline = time.monotonic() + DEMO_TIMEOUT_S
    while not job.final and time.monotonic() < deadline:
        job = client.result(job.id, wait=DEMO_POLL_S)
        _check(supervisor)
    return job


def demo_jpeg() -> bytes:
    """A DEMO_IMAGE_PX square JPEG made on the spot (colour gradients: no photo to fetch)."""
    import io

    from PIL import Image

    side = DEMO_IMAGE_PX
    red = Image.linear_gradient("L").resize((side, side))
    image = Image.merge("RGB", (red, red.rotate(90), red.rotate(180)))
    out = io.BytesIO()
    image.save(out, format="JPEG")
    return out.getvalue()


def demo(base_url: str, supervisor: Supervisor, served: Sequence[str]) -> int:
    """Send one synthetic job through the stack and print its result; then, when a
    worker serves it, one image to the built-in classifier and print its top labels."""
    job_input = {"value": "hello from carpool", "size": 12}
    with Client(base_url) as client:
        try:
            job = client.submit("synthetic", job_input)
            print("POST /submit")
            _print(dict(job.doc))
            job = _follow(client, job, supervisor)
            print(f"GET /result/{job.id}?wait={DEMO_POLL_S}")
            _print(dict(job.doc))
            if job.status != "done":
                return 1
            if DEMO_IMAGE_MODEL not in served:
                print(f"no image job: no worker serves {DEMO_IMAGE_MODEL} (its line above "
                      "says why)")
                return 0
            image = client.submit_file(DEMO_IMAGE_MODEL, demo_jpeg(), "image/jpeg")
            image = _follow(client, image, supervisor)
        except ApiError as exc:
            print(f"carpool: {exc}", file=sys.stderr)
            return 1
    print(f"POST /submit?model={DEMO_IMAGE_MODEL} (a {DEMO_IMAGE_PX}x{DEMO_IMAGE_PX} JPEG of "
          f"colour gradients): {image.status}")
    if image.status != "done":
        _print(dict(image.doc))
        return 1
    for top in image.result["top_k"]:
        print(f"  {top['score']:6.1%}  {top['label']}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    opts = UpOptions(port=args.port, redis_url=args.redis_url,
                     workers=parse_workers(args.workers),
                     flower=not args.no_flower, flower_port=args.flower_port,
                     models=args.models, state_dir=Path(args.state_dir))
    stopping = threading.Event()
    held: list[Supervisor] = []  # the stack's, once started

    def interrupted(signum: int, frame: object) -> None:
        # Ctrl-C reaches the children too (one process group; Redis has its own):
        # restarting them as they exit would fight the stop. SIGTERM and SIGHUP stop
        # the stack the same way. Once: a second signal must not cut the stop short
        # (children left running, Redis orphaned).
        for supervisor in held:
            supervisor.hold()
        if stopping.is_set():
            return
        stopping.set()
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    try:
        stack, urls, notes = start_stack(opts)
    except KeyboardInterrupt:  # stopped while starting: start_stack stopped what it began
        return 0
    supervisor = stack.supervisor
    held.append(supervisor)
    try:
        for note in notes:
            print(note, file=sys.stderr)
        _wait_ready(urls["api"], supervisor)
        for name, url in urls.items():
            print(f"{name:7s} {url}")
        print(f"logs    {opts.state_dir}/", flush=True)
        served = report_until_ready(stack.env, stack.workers, str(opts.state_dir),
                                    check=lambda: _check(supervisor),
                                    pause=supervisor.failed.wait,
                                    say=lambda line: print(line, flush=True))
        if stack.bounds.scaling:
            stack.scaler = Autoscaler(stack, say=lambda line: print(line, flush=True))
            stack.scaler.start()
            print(f"scale   {stack.bounds.low}..{stack.bounds.high} workers by need "
                  f"(changes below and in {opts.state_dir}/scaling.log)", flush=True)
        code = demo(urls["api"], supervisor, served) if args.demo else 0
        if args.once:
            return code
        print("carpool is up; Ctrl-C stops it.", flush=True)
        supervisor.failed.wait()  # a crash loop (Ctrl-C and SIGTERM raise KeyboardInterrupt)
        print(f"stopped: {supervisor.failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        print("stopping carpool ...", file=sys.stderr)
        supervisor.hold()
        stack.stop()


def _answer(call: Callable[[Client], Job], args: argparse.Namespace) -> int:
    """Print the job document; a refusal is one line on stderr and exit 1."""
    with Client(args.url, api_key=args.api_key or None) as client:
        try:
            job = call(client)
        except ApiError as exc:
            print(f"carpool: {exc}", file=sys.stderr)
            return 1
    _print(dict(job.doc))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    if args.file:
        try:
            data = Path(args.file).read_bytes()
        except OSError as exc:
            raise CarpoolError(f"cannot read --file {args.file}: {exc.strerror}") from None
        return _answer(lambda c: c.submit_file(args.model, data, args.content_type,
                                               wait=args.wait), args)
    try:
        job_input = json.loads(args.input)
    except ValueError as exc:
        raise CarpoolError(f"--input is not JSON: {exc}") from None
    return _answer(lambda c: c.submit(args.model, job_input, wait=args.wait), args)


def cmd_result(args: argparse.Namespace) -> int:
    return _answer(lambda c: c.result(args.id, wait=args.wait), args)


def cmd_bench(rest: list[str]) -> int:
    # Imported here: neither the bench nor the simulator is needed by other commands.
    if rest[:1] == ["simulate"]:
        from carpool.sim.cli import main as simulate

        return int(simulate(rest[1:]))
    if rest[:1] == ["simulate-scaling"]:
        from carpool.sim.scaling_cli import main as simulate_scaling

        return int(simulate_scaling(rest[1:]))
    from carpool.bench.cli import main as bench_main

    return int(bench_main(rest))


def cmd_audit(args: argparse.Namespace) -> int:
    """Check "each job in exactly one place" on one snapshot; list the dead letters."""
    from carpool.backend.audit import snapshot, violations
    from carpool.backend.connection import connect
    from carpool.backend.keys import BULK_HOOK_TAG, Keys
    from carpool.backend.leases import Leases
    from carpool.backend.outbox import Outbox
    from carpool.core.settings import load_settings
    from carpool.core.shards import shard

    settings = load_settings()
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    keys = Keys(settings.key_prefix)
    found = violations(snapshot(client, keys, [spec.name for spec in settings.catalogue]))
    dead = Leases(client, keys, settings.catalogue).dead_letters(args.dead)
    for line in found:
        print(line)
    print(f"{len(found)} jobs not in exactly one place; {len(dead)} dead letters shown "
          "(failed by the reaper, newest first)")
    for job_id in dead:
        print(f"  {job_id}")
    tags = [BULK_HOOK_TAG, *sorted({shard(spec.name) for spec in settings.catalogue})]
    hooks = Outbox(client, keys).dead(tags, args.dead)
    print(f"{len(hooks)} dead webhook deliveries shown (never answered 2xx in time, or "
          "refused), newest first")
    for d in hooks:
        print(f"  {d['id']} {d['event']} {d['url']} attempts={d['attempts']} "
              f"last_status={d['last_status']} last_error={d['last_error']}")
    _audit_outboxes(Outbox(client, keys), keys, set(tags), settings.webhooks.max_age_s)
    return 1 if found else 0


def cmd_bulk(args: argparse.Namespace) -> int:
    return run_bulk_command(args)


def _audit_outboxes(outbox: Outbox, keys: Keys, tags: set[str], max_age_s: float) -> None:
    """Every non-empty webhook outbox; those no dispatcher takes (no catalogued model
    uses the shard) or overdue past max_age_s are named with the command that drops them."""
    now_ms = time.time() * 1000
    waiting = outbox.every_outbox()
    print(f"{sum(n for n, _ in waiting.values())} webhook events waiting in "
          f"{len(waiting)} outboxes")
    for tag, (n, due_ms) in sorted(waiting.items()):
        overdue_s = max(0.0, (now_ms - due_ms) / 1000)
        why = ("no model in the catalogue uses this shard: no dispatcher takes them"
               if tag not in tags else "overdue past CARPOOL_WEBHOOK_MAX_AGE_S: is a "
               "dispatcher running?" if overdue_s > max_age_s else "")
        print(f"  shard {tag}: {n} events, the earliest due {overdue_s:.0f} s ago"
              + (f"; {why}; drop them with: redis-cli DEL '{keys.outbox(tag)}'" if why
                 else ""))


def _client_options(p: argparse.ArgumentParser) -> None:
    # The environment only gives defaults here: these are the client's, not the server's
    # settings (carpool.core.settings), and a flag always wins.
    p.add_argument("--url", default=os.environ.get("CARPOOL_URL", DEFAULT_URL),
                   help="the web tier (default: $CARPOOL_URL, else %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("CARPOOL_API_KEY", ""),
                   help="sent as 'Authorization: Bearer' (default: $CARPOOL_API_KEY)")


#: Entry points that add a subcommand: each is called with the subparsers and adds
#: its own, ``func`` set. The worker registers ``calibrate`` here (pyproject.toml),
#: so the core never imports the worker.
COMMANDS_GROUP = "carpool.commands"


def _bulk_parser(sub: Any) -> None:
    b = sub.add_parser("batch", help="bulk batches: submit a JSONL file, follow it, get "
                       "its results (docs/batches.md)")
    bsub = b.add_subparsers(dest="bulk_command", required=True, metavar="COMMAND",
                            parser_class=HelpParser)
    s = bsub.add_parser("submit", help="upload FILE and start a batch; prints its id")
    s.add_argument("file", type=Path, help="JSONL: request lines, or one input a line")
    s.add_argument("--model", required=True, help="the model (where a line names none)")
    s.add_argument("--endpoint", default="/submit", choices=["/submit", "/v1/embeddings"],
                   help="what each line calls: carpool's own submit, or OpenAI's embeddings")
    s.add_argument("--window", default="24h", help="the completion window")
    st = bsub.add_parser("status", help="print a batch's document")
    st.add_argument("id")
    st.add_argument("--wait", action="store_true", help="with a progress bar, until it ends")
    r = bsub.add_parser("results", help="wait for a batch, then write its output and errors")
    r.add_argument("id")
    r.add_argument("-o", "--output", type=Path, required=True, help="the output lines")
    r.add_argument("--errors", type=Path, default=None,
                   help="the error lines (default: OUTPUT with .errors.jsonl)")
    for p in (s, st, r):
        _client_options(p)
        p.set_defaults(func=cmd_bulk)


def parser() -> argparse.ArgumentParser:
    p = HelpParser(prog="carpool", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           title="commands", parser_class=HelpParser)
    up = sub.add_parser("up", help="start Redis, web, workers and Flower locally",
                        description="Start Redis (or use one), gunicorn, Celery workers and "
                        "Flower on this machine; Ctrl-C stops them all.")
    up.add_argument("--port", type=int, default=None,
                    help=f"the web tier's port (default {DEFAULT_WEB_PORT}, or a free one if "
                    "taken)")
    up.add_argument("--redis-url", default=None,
                    help="use this Redis; default: 127.0.0.1:6379 if it answers, else start one")
    up.add_argument("--workers", default="1",
                    help="Celery workers to start: N, or MIN..MAX to start and stop them by "
                         "the scaling rule (one per GPU where there are GPUs)")
    up.add_argument("--no-flower", action="store_true", help="do not start Flower")
    up.add_argument("--flower-port", type=int, default=None,
                    help=f"Flower's port (default {DEFAULT_FLOWER_PORT}, or a free one if taken)")
    up.add_argument("--models", default="", help="comma list the workers serve (default: all)")
    up.add_argument("--state-dir", default=".carpool", help="logs and the local Redis's data")
    up.add_argument("--demo", action="store_true",
                    help="send one job and one image through once it is up")
    up.add_argument("--once", action="store_true", help="stop after start-up (and the demo)")
    up.set_defaults(func=cmd_up)
    s = sub.add_parser("submit", help="submit one job")
    _client_options(s)
    s.add_argument("--model", default="synthetic", help="the model to run (GET /models)")
    s.add_argument("--input", default='{"value": 1, "size": 8}', help="the job input, JSON")
    s.add_argument("--file", help="submit this file's bytes instead (an image)")
    s.add_argument("--content-type", default="image/jpeg", help="with --file: its type")
    s.add_argument("--wait", type=float, default=0.0,
                   help="answer with the result if the job ends within this many seconds")
    s.set_defaults(func=cmd_submit)
    r = sub.add_parser("result", help="fetch one result")
    r.add_argument("id", help="the job id that submit printed")
    _client_options(r)
    r.add_argument("--wait", type=float, default=0.0, help="long-poll up to this many seconds")
    r.set_defaults(func=cmd_result)
    a = sub.add_parser("audit", help="check that every job is in exactly one place; "
                       "list the dead letters and dead webhook deliveries",
                       description="Read every bin, lease and job record of this "
                       "CARPOOL_KEY_PREFIX in one read-only script (it uses KEYS: for rare "
                       "operator use, not a monitoring loop) and print each job that is "
                       "not in exactly one place; exit status 1 if any. Settings come from "
                       "the environment (CARPOOL_REDIS_URL, CARPOOL_KEY_PREFIX).")
    a.add_argument("--dead", type=int, default=20,
                   help="how many dead letters (jobs failed by the reaper) and dead webhook "
                   "deliveries (per shard) to list")
    a.set_defaults(func=cmd_audit)
    add_commands(sub, _client_options)  # status, models, cancel, watch
    _bulk_parser(sub)
    for command in entry_points(group=COMMANDS_GROUP):
        command.load()(sub)  # the worker's `calibrate`, in this distribution
    sub.add_parser("bench", help="load generator and benchmarks (carpool bench --help)",
                   add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:])
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CarpoolError as exc:  # ClientError included: nothing listens, say
        print(f"carpool: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or folder a command did not check: a line, not a traceback
        print(f"carpool: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
