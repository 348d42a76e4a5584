"""The client's commands: ``carpool status``, ``models``, ``cancel ID``, ``watch ID``.

Each prints what the server answers (``watch`` one line per event, as it comes) and
exits 1 when the server refused (the message on stderr); carpool/cli.py adds them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from carpool.client.errors import ApiError
from carpool.client.protocol import RetryPolicy
from carpool.client.sync import Client
from carpool.core.api_keys import KEY_TIERS

#: Adds --url and --api-key to a command's parser (carpool/cli.py owns them).
AddClientOptions = Callable[[argparse.ArgumentParser], None]


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, api_key=args.api_key or None)


def _refused(exc: ApiError) -> int:
    print(f"carpool: {exc}", file=sys.stderr)
    return 1


#: The tiers as ``carpool status`` lists a model's refusals: highest first.
_TIERS_SHOWN = tuple(reversed(KEY_TIERS))


def model_line(model: dict[str, Any]) -> str:
    """One model as ``carpool status`` prints it: its workers' state, its depth, and
    the jobs admission refused by service tier (a server without them: no column)."""
    depth = sum(int(b.get("depth", 0)) for b in model.get("bins", []))
    workers = model.get("workers", {})
    state = workers.get("state", "?") if isinstance(workers, dict) else "?"
    bins = " ".join(f"{b['name']}={b.get('depth', 0)}" for b in model.get("bins", []))
    line = f"{model['name']:<16} {state:<10} depth {depth:<6} {bins}"
    refused = model.get("refused_by_tier")
    if isinstance(refused, dict):
        line += "  refused " + " ".join(f"{t}={refused.get(t, 0)}" for t in _TIERS_SHOWN)
    return line


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        health = client.health()
        print(f"web {args.url}: live {'yes' if health['live'] else 'no'}, "
              f"ready {'yes' if health['ready'] else 'no'}")
        if not health["ready"]:
            return 1
        try:
            models = client.models()
        except ApiError as exc:
            return _refused(exc)
    for model in models:
        print(model_line(model))
    return 0


def _config(text: str) -> dict[str, Any] | None:
    """``--config``'s JSON object (None when not given); the server checks the rest."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ApiError(400, "invalid_config", f"--config is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "invalid_config", "--config must be a JSON object")
    return doc


def cmd_models(args: argparse.Namespace) -> int:
    """``GET /models``; or the repository API: ``list``, ``load M``, ``unload M``."""
    # Asked once: a refused load or unload is the answer, not a reason to retry.
    with Client(args.url, api_key=args.api_key or None, retry=RetryPolicy(attempts=1)) as c:
        try:
            if args.action == "list":
                for entry in c.repository_index():
                    print(f"{entry['name']:<20} {entry['version']:<4} {entry['state']:<12} "
                          f"{entry.get('reason', '')}".rstrip())
            elif args.action == "load":
                print(json.dumps(c.load_model(args.model, _config(args.config))))
            elif args.action == "unload":
                print(json.dumps(c.unload_model(args.model)))
            else:
                print(json.dumps(c.models(), indent=2))
        except ApiError as exc:
            return _refused(exc)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        try:
            was_queued = client.cancel(args.id)
        except ApiError as exc:
            return _refused(exc)
    print(f"{args.id} cancelled" if was_queued else f"{args.id} had ended; its result is deleted")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """One line per event: ``<event> <JSON document>``; exit 0 when the job ended done."""
    last = ""
    with _client(args) as client:
        try:
            for event in client.events([args.id]):
                print(f"{event.event} {json.dumps(dict(event.data))}", flush=True)
                last = event.event
        except ApiError as exc:
            return _refused(exc)
    return 0 if last == "done" else 1


def add_commands(sub: Any, client_options: AddClientOptions) -> None:
    """Add status, models, cancel and watch to ``sub`` (argparse's subparsers)."""
    st = sub.add_parser("status", help="the web's health, each model's workers, depth and "
                                       "refusals by service tier")
    client_options(st)
    st.set_defaults(func=cmd_status)
    m = sub.add_parser("models", help="GET /models: every model, its bins and workers; "
                       "list, load and unload them (the repository API, docs/v2.md)")
    msub = m.add_subparsers(dest="action", metavar="ACTION")
    ml = msub.add_parser("list", help="each model's state: READY, LOADING, UNLOADING, "
                         "UNAVAILABLE and why")
    mload = msub.add_parser("load", help="load (or reload) a model; answers once served")
    mload.add_argument("model", help="the model (every version), or m@v (one)")
    mload.add_argument("--config", default="", help="a JSON catalogue entry overriding "
                       "the model's, e.g. '{\"options\": {\"weights\": \"/m.pt\"}}'")
    munload = msub.add_parser("unload", help="unload a model: its queued jobs fail, its "
                              "claimed ones finish")
    munload.add_argument("model", help="the model (every version), or m@v (one)")
    client_options(m)
    m.set_defaults(func=cmd_models)
    for p in (ml, mload, munload):  # the options after the action too, those before kept
        p.add_argument("--url", default=argparse.SUPPRESS, help="as before the action")
        p.add_argument("--api-key", default=argparse.SUPPRESS, help="as before the action")
    c = sub.add_parser("cancel", help="cancel a queued job (a finished one's result is deleted)")
    c.add_argument("id", help="the job id")
    client_options(c)
    c.set_defaults(func=cmd_cancel)
    w = sub.add_parser("watch", help="follow a job's event stream, one line per event")
    w.add_argument("id", help="the job id")
    client_options(w)
    w.set_defaults(func=cmd_watch)
