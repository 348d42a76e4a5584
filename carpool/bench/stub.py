"""A trivial job API server: the far end for measuring the generator's own ceiling.

It answers ``GET /healthz``, ``POST /submit`` and ``GET /result/<id>`` like the
real web tier does for the synthetic model, at once and from memory, so the
generator's full per-job work (two requests, JSON, the checksum check) is what
runs out first. Run it in its own process: ``python -m carpool.bench.stub PORT``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from typing import Any

from carpool.core.synthetic import expected_result

_ids = itertools.count()
_jobs: dict[str, dict[str, Any]] = {}


def _answer(status: int, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    reason = {200: "OK", 202: "Accepted", 404: "Not Found"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def respond(method: str, path: str, body: bytes) -> bytes:
    """The stub's whole API."""
    if method == "POST" and path == "/submit":
        job_id = f"stub{next(_ids):018d}"
        _jobs[job_id] = json.loads(body)["input"]
        return _answer(202, {"id": job_id, "status": "queued", "result_url": f"/result/{job_id}"})
    if method == "GET" and path.startswith("/result/"):
        job_id = path[len("/result/"):].partition("?")[0]
        job_input = _jobs.pop(job_id, None)
        if job_input is None:
            return _answer(404, {"error": {"code": "not_found", "message": job_id}})
        return _answer(200, {
            "id": job_id, "model": "synthetic", "status": "done",
            "result": expected_result(job_input),
            "timings_ms": {"queue": 0.0, "preprocess": 0.0, "inference": 0.0, "total": 0.0},
            "batch": {"size": 1, "bin": "small", "worker": "stub"},
        })
    if path == "/healthz":
        return _answer(200, {"status": "ok"})
    return _answer(404, {"error": {"code": "not_found", "message": path}})


class _Server(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            method, path, _ = lines[0].split(" ", 2)
            assert self.transport is not None
            self.transport.write(respond(method, path, body))


async def serve(port: int, ready: asyncio.Event | None = None) -> None:
    server = await asyncio.get_running_loop().create_server(_Server, "127.0.0.1", port)
    if ready is not None:
        ready.set()
    print(f"stub listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
