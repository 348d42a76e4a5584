"""Bulk batches from the command line (``carpool batch ...``), over /v1/files and
/v1/batches with httpx: for people without the openai SDK (docs/batches.md)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import httpx

from carpool.client.errors import ClientError
from carpool.client.protocol import RetryPolicy, error_for, headers, unreachable

#: Statuses a batch never leaves.
FINAL = ("failed", "completed", "expired", "cancelled")
#: How often a waiting command reads the batch again, in seconds.
POLL_S = 1.0
#: A generous bound on one request (an upload of 200 MB included).
TIMEOUT_S = 300.0
#: How a wait for a batch (hours, maybe) reads on through 429, 503 and refused
#: connections, a web restart: 7 tries a read, backoff doubling from 1 s (with jitter,
#: so half a minute or more in all) before it gives up.
WAIT_RETRY = RetryPolicy(attempts=7, first_backoff_s=1.0, max_backoff_s=60.0)
#: Batches listed to find one a create whose answer was lost made: the newest first,
#: so only as many as this key makes while one create is retried.
LOOK_BACK = 100

T = TypeVar("T")


def request_lines(text: str, model: str, endpoint: str) -> bytes:
    """The batch file for ``text``: a line that is already a request (it has a
    ``custom_id``) gets ``model`` where its body names none; any other JSON line is
    an input, wrapped as request ``line-<n>`` (a string or ``{"text"}`` for
    /v1/embeddings, the model's input for /submit)."""
    out = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise ClientError(f"line {n} is not JSON: {exc}") from None
        if isinstance(doc, dict) and "custom_id" in doc:
            if isinstance(doc.get("body"), dict):
                doc["body"].setdefault("model", model)
        else:
            if endpoint == "/v1/embeddings":
                value = doc.get("text") if isinstance(doc, dict) else doc
                body = {"model": model, "input": value}
            else:
                body = {"model": model, "input": doc}
            doc = {"custom_id": f"line-{n}", "method": "POST", "url": endpoint, "body": body}
        out.append(json.dumps(doc))
    return ("\n".join(out) + "\n").encode()


def read_jsonl(path: Path) -> str:
    """``path``'s text; one that cannot be read, or is not UTF-8 (as JSONL is), is a
    ClientError that says which line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ClientError(f"{path}: line {line} is not UTF-8 (byte {data[exc.start]:#04x}); "
                          "a JSONL file is UTF-8 text") from None


def check_writable(path: Path) -> None:
    """Raises ClientError unless ``path`` can be written: asked before a wait of hours
    for the batch, not after it."""
    folder = path.parent
    if not folder.is_dir():
        raise ClientError(f"cannot write {path}: there is no folder {folder}")
    if path.is_dir():
        raise ClientError(f"cannot write {path}: it is a folder")
    # An existing file needs only its own permission (/dev/stdout, a file in a folder
    # the user cannot add to); a new one, its folder's.
    if not (os.access(path, os.W_OK) if path.exists()
            else os.access(folder, os.W_OK | os.X_OK)):
        raise ClientError(f"cannot write {path}: permission denied")


class Bulk:
    def __init__(self, url: str, api_key: str | None, *, retry: RetryPolicy | None = None,
                 wait_retry: RetryPolicy = WAIT_RETRY) -> None:
        self.http = httpx.Client(base_url=url.rstrip("/") + "/v1", headers=headers(api_key),
                                 timeout=TIMEOUT_S)
        self.retry = retry or RetryPolicy()
        self.wait_retry = wait_retry

    def close(self) -> None:
        self.http.close()

    def _ok(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                code, message = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                code, message = "error", resp.text[:200]
            raise error_for(resp.status_code, code, message, resp.headers.get("Retry-After"))
        return resp

    def _retried(self, read: Callable[[], T], policy: RetryPolicy,
                 pause: Callable[[float], object], *, safe_again: bool = True,
                 before_again: Callable[[], T | None] | None = None) -> T:
        """``read()``, tried again through 429, 503 and refused connections as ``policy``
        says, and broken ones where ``safe_again``; ``before_again`` may find what a try
        whose answer was lost did, answered instead. Giving up, the error says what was
        seen last."""
        tries = 0
        while True:
            tries += 1
            try:
                return read()
            except ClientError as exc:
                delay_s = policy.delay_s(tries, exc, safe_again=safe_again)
                if delay_s is None and tries == 1:
                    raise
                if delay_s is None:
                    raise ClientError(f"gave up after {tries} tries; the last: {exc}") from None
                pause(delay_s)
            done = before_again() if before_again is not None else None
            if done is not None:
                return done

    def _call(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        """``send()``'s answer if a 2xx; its typed error, or the transport's, else."""
        try:
            answer: httpx.Response = self._ok(send())
        except httpx.TransportError as exc:  # a refused connect is retried, broken ones
            raise unreachable(str(self.http.base_url), exc) from None  # where safe
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach {self.http.base_url}: {exc}") from None
        return answer

    def submit(self, path: Path, model: str, endpoint: str, window: str) -> dict[str, Any]:
        data = request_lines(read_jsonl(path), model, endpoint)
        # An upload asked again makes at most a second file, never a batch: retried
        # through a broken connection too (the unused file expires with the others).
        f = self._retried(lambda: self._call(lambda: self.http.post(
            "/files", data={"purpose": "batch"}, files={"file": (path.name, data)})).json(),
            self.retry, time.sleep)
        body = {"input_file_id": f["id"], "endpoint": endpoint, "completion_window": window}
        # The server takes no Idempotency-Key on /v1/batches: before a second try, a
        # batch that a try whose answer was lost made is looked for by its input file,
        # uploaded just now, so a retry never makes a second batch.
        return dict(self._retried(
            lambda: self._call(lambda: self.http.post("/batches", json=body)).json(),
            self.retry, time.sleep, before_again=lambda: self._made_from(f["id"])))

    def _made_from(self, file_id: str) -> dict[str, Any] | None:
        """The newest batch of this key whose input is ``file_id``, if any (among the
        last LOOK_BACK made)."""
        page = self._retried(lambda: self._call(lambda: self.http.get(
            "/batches", params={"limit": LOOK_BACK})).json(), self.retry, time.sleep)
        return next((dict(b) for b in page.get("data", [])
                     if b.get("input_file_id") == file_id), None)

    def _read(self, bulk_id: str) -> dict[str, Any]:
        return dict(self._call(lambda: self.http.get(f"/batches/{bulk_id}")).json())

    def status(self, bulk_id: str) -> dict[str, Any]:
        return self._retried(lambda: self._read(bulk_id), self.retry, time.sleep)

    def wait(self, bulk_id: str, on_progress: Callable[[dict[str, Any]], None],
             pause: Callable[[float], object] = time.sleep) -> dict[str, Any]:
        while True:
            doc = self._retried(lambda: self._read(bulk_id), self.wait_retry, pause)
            on_progress(doc)
            if doc["status"] in FINAL:
                return doc
            pause(POLL_S)

    def content(self, file_id: str) -> bytes:
        """A file's bytes, read again whole through 429, 503 and broken connections (the
        server answers no ``Range``: a cut download starts over, within the policy)."""
        return self._retried(lambda: bytes(self._call(
            lambda: self.http.get(f"/files/{file_id}/content")).content), self.retry,
            time.sleep)


def progress_bar(out: TextIO = sys.stderr, width: int = 30) -> Callable[[dict[str, Any]], None]:
    """Draws ``[#####.....] done/total status`` on one line of ``out``, redrawn in place."""
    def draw(doc: dict[str, Any]) -> None:
        counts = doc.get("request_counts") or {}
        total = int(counts.get("total") or 0)
        done = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
        filled = width * done // total if total else 0
        end = "\n" if doc["status"] in FINAL else ""
        out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                  f"{doc['status']:<11}{end}")
        out.flush()
    return draw


def run_bulk_command(args: Any) -> int:
    """``carpool batch submit|status|results`` (carpool/cli.py parses the arguments)."""
    bulk = Bulk(args.url, args.api_key or None)
    try:
        if args.bulk_command == "submit":
            doc = bulk.submit(args.file, args.model, args.endpoint, args.window)
            print(doc["id"])
            return 0
        if args.bulk_command == "status":
            doc = bulk.wait(args.id, progress_bar()) if args.wait else bulk.status(args.id)
            print(json.dumps(doc, indent=2))
            return 0 if doc["status"] != "failed" else 1
        errors_path = args.errors or args.output.with_suffix(".errors.jsonl")
        for path in (args.output, errors_path):
            check_writable(path)
        doc = bulk.wait(args.id, progress_bar())
        args.output.write_bytes(bulk.content(doc["output_file_id"])
                                if doc.get("output_file_id") else b"")
        errors = bulk.content(doc["error_file_id"]) if doc.get("error_file_id") else b""
        errors_path.write_bytes(errors)
        counts = doc.get("request_counts") or {}
        print(f"{doc['status']}: {counts.get('completed', 0)} lines in {args.output}, "
              f"{counts.get('failed', 0)} in {errors_path}", file=sys.stderr)
        if doc["status"] == "failed":
            print(json.dumps(doc.get("errors"), indent=2), file=sys.stderr)
        return 0 if doc["status"] == "completed" else 1
    finally:
        bulk.close()
