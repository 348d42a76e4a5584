"""The async HTTP load driver: open loop, each job submitted then long-polled.

Arrivals follow the schedule's clock whatever the server does; latency is
measured from each job's *scheduled* time, so a slow server (or a slow
generator) shows up as latency instead of quietly lowering the offered rate.
Submits and long-polls use separate connection pools: a backlog of waiting
polls must never delay the next arrival's submit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from carpool.admission.urgency import MAX_PRIORITY
from carpool.bench.arrivals import Arrival
from carpool.bench.httpclient import ConnectionClosed, HttpClient
from carpool.bench.records import JobRecord, Outcome, Verdict, batch_fields, verify
from carpool.bench.workload import SYNTHETIC, make_input
from carpool.core.synthetic import checksum

FINAL = frozenset({"done", "failed", "expired", "cancelled"})
#: How each job travels: ``poll``, POST /submit then GET /result?wait until final;
#: ``wait``, POST /submit?wait (one round trip); ``v2``, POST /v2/models/<m>/infer
#: (the Open Inference Protocol, one round trip; docs/v2.md).
PROTOCOLS = ("poll", "wait", "v2")
#: Pause before asking again after a 5xx (e.g. 503 while Redis restarts).
RETRY_PAUSE_S = 0.2


@dataclass(frozen=True)
class HttpOptions:
    base_url: str
    model: str = SYNTHETIC
    #: ``?wait=`` of each long-poll, seconds.
    poll_wait_s: float = 30.0
    #: After the last arrival, how long results may take before a job counts as lost.
    grace_s: float = 60.0
    submit_connections: int = 128
    poll_connections: int = 1024
    #: False: every request on a new connection, closed after (a client without a session).
    keep_alive: bool = True
    #: A job's client gives up this long after its scheduled arrival (0: never).
    client_timeout_s: float = 0.0
    #: Sent as ``Authorization: Bearer`` (a tenant of a server with API keys).
    api_key: str = ""
    protocol: str = "poll"  # one of PROTOCOLS
    #: A job's input from (nonce, seq, arrival); None: the synthetic model's (make_input).
    job_input: Callable[[str, int, Arrival], dict[str, Any]] | None = None
    #: Judges a final body: (job id, input, body); None: the synthetic model's (verify).
    verify: Callable[[str, dict[str, Any], dict[str, Any]], Verdict] | None = None


class HttpDriver:
    def __init__(self, opts: HttpOptions, nonce: str, tick: Callable[[], None]) -> None:
        self.opts = opts
        self.nonce = nonce
        self.tick = tick
        auth = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else None
        self.submit = HttpClient(opts.base_url, opts.submit_connections, auth, opts.keep_alive)
        self.poll = HttpClient(opts.base_url, opts.poll_connections, auth, opts.keep_alive)
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.deadline = self.t0
        #: The id each admitted job got (by seq): a record of a client that gave up has it.
        self.admitted: dict[int, str] = {}

    def now(self) -> float:
        return self.loop.time() - self.t0

    async def run(self, arrivals: Sequence[Arrival]) -> list[JobRecord]:
        self.t0 = self.loop.time()
        last = arrivals[-1].t_s if arrivals else 0.0
        self.deadline = last + self.opts.grace_s
        tasks = []
        for seq, arrival in enumerate(arrivals):
            delay = arrival.t_s - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self.job(seq, arrival)))
        records = list(await asyncio.gather(*tasks))
        self.submit.close()
        self.poll.close()
        return records

    async def job(self, seq: int, arrival: Arrival) -> JobRecord:
        if self.opts.client_timeout_s > 0:
            t_start = self.now()
            try:
                async with asyncio.timeout(arrival.t_s + self.opts.client_timeout_s - t_start):
                    record = await self._job(seq, arrival)
            except TimeoutError:
                record = JobRecord(seq, arrival.size, arrival.t_s, t_start, Outcome.TIMEOUT,
                                   t_final=self.now(), job_id=self.admitted.get(seq, ""),
                                   detail="the client gave up")
        else:
            record = await self._job(seq, arrival)
        self.tick()
        return record

    async def _job(self, seq: int, arrival: Arrival) -> JobRecord:
        # One JobRecord built at the end: dataclasses.replace per step cost ~25 µs a job.
        if self.opts.job_input is not None:
            job_input = self.opts.job_input(self.nonce, seq, arrival)
        else:
            job_input = make_input(self.nonce, seq, arrival.size, arrival.payload)
        judge = self.opts.verify or verify
        t_start = self.now()

        def record(outcome: Outcome, status: int = 0, **more: Any) -> JobRecord:
            return JobRecord(seq, arrival.size, arrival.t_s, t_start, outcome,
                             http_status=status, **more)

        if self.opts.protocol == "v2":
            return await self._job_v2(seq, arrival, t_start)
        request: dict[str, Any] = {"model": self.opts.model, "input": job_input}
        if arrival.deadline_ms:
            request["deadline_ms"] = arrival.deadline_ms
        if arrival.priority:
            request["priority"] = arrival.priority
        payload = json.dumps(request).encode()
        inline = self.opts.protocol == "wait"
        path = f"/submit?wait={self.opts.poll_wait_s:g}" if inline else "/submit"
        try:
            answer = await self.submit.request("POST", path, payload)
        except (OSError, ConnectionClosed) as exc:
            return record(Outcome.ERROR, t_final=self.now(), detail=f"submit: {exc}")
        if answer.status == 429:
            return record(Outcome.REJECTED, 429, t_final=self.now())
        if inline and answer.status == 200:  # the final result, inline
            body_now: dict[str, Any] = json.loads(answer.body)
            verdict = judge(str(body_now.get("id")), job_input, body_now)
            return record(verdict.outcome, 200, t_final=self.now(), job_id=str(body_now["id"]),
                          detail=verdict.detail, **batch_fields(body_now))
        if answer.status != 202:
            detail = answer.body[:200].decode("utf-8", "replace")
            return record(Outcome.ERROR, answer.status, t_final=self.now(), detail=detail)
        job_id = str(json.loads(answer.body)["id"])
        self.admitted[seq] = job_id
        body = await self._await_final(job_id)
        if body is None:
            return record(Outcome.LOST, 202, job_id=job_id, detail="not final before the deadline")
        if not body:
            return record(Outcome.LOST, 202, job_id=job_id, detail="404 for an accepted id")
        verdict = judge(job_id, job_input, body)
        return record(verdict.outcome, 202, t_final=self.now(), job_id=job_id,
                      detail=verdict.detail, **batch_fields(body))

    async def _job_v2(self, seq: int, arrival: Arrival, t_start: float) -> JobRecord:
        """One infer request of one row: VALUE is ``size`` floats, the first the job's
        sequence number, so ECHO tells a misrouted answer; CHECKSUM covers the row."""
        row = [float(seq)] + [0.0] * (arrival.size - 1) if arrival.size else []
        parameters: dict[str, Any] = {}
        if arrival.deadline_ms:
            parameters["timeout"] = arrival.deadline_ms * 1000
        if arrival.priority:  # carpool's 9 is Triton's 1
            parameters["priority"] = MAX_PRIORITY - arrival.priority + 1
        request: dict[str, Any] = {"inputs": [{"name": "VALUE", "datatype": "FP32",
                                               "shape": [1, len(row)], "data": row}]}
        if parameters:
            request["parameters"] = parameters

        def record(outcome: Outcome, status: int = 0, detail: str = "") -> JobRecord:
            return JobRecord(seq, arrival.size, arrival.t_s, t_start, outcome,
                             http_status=status, t_final=self.now(), detail=detail)

        try:
            answer = await self.submit.request(
                "POST", f"/v2/models/{self.opts.model}/infer", json.dumps(request).encode())
        except (OSError, ConnectionClosed) as exc:
            return record(Outcome.ERROR, detail=f"infer: {exc}")
        if answer.status in (429, 503):
            return record(Outcome.REJECTED, answer.status)
        if answer.status != 200:
            return record(Outcome.ERROR, answer.status,
                          answer.body[:200].decode("utf-8", "replace"))
        outputs = {o["name"]: o["data"] for o in json.loads(answer.body)["outputs"]}
        expected = checksum({"value": row, "size": arrival.size})
        if outputs.get("ECHO") != row or outputs.get("CHECKSUM") != [expected]:
            return record(Outcome.MISROUTED, 200, f"echo {str(outputs.get('ECHO'))[:60]}")
        return record(Outcome.OK, 200)

    async def _await_final(self, job_id: str) -> dict[str, Any] | None:
        """The final result body; {} when the id is unknown; None at the run's deadline."""
        while (remaining := self.deadline - self.now()) > 0:
            wait = min(self.opts.poll_wait_s, max(remaining, 0.1))
            try:
                answer = await self.poll.request("GET", f"/result/{job_id}?wait={wait:.1f}")
            except (OSError, ConnectionClosed):
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            if answer.status == 404:
                return {}
            if answer.status != 200:
                await asyncio.sleep(RETRY_PAUSE_S)  # 503 while Redis restarts, say
                continue
            body: dict[str, Any] = json.loads(answer.body)
            if body.get("status") in FINAL:
                return body
        return None


def run_http(
    arrivals: Sequence[Arrival], opts: HttpOptions, nonce: str,
    tick: Callable[[], None] = lambda: None,
) -> list[JobRecord]:
    """Drive ``arrivals`` at the web tier; ``tick()`` as each job ends; one record per job."""

    async def main() -> list[JobRecord]:
        return await HttpDriver(opts, nonce, tick).run(arrivals)

    return asyncio.run(main())
