"""minilm under a surge: goodput and late jobs at factors × its offline rate, old code
against new, each beside the offline rate measured in the same run.

    python ops/bench/surge_text.py --roots /path/to/old,. \\
        --factors 1.5,3 --duration 30 --out surge.json --records surge.jsonl

Texts: the docstrings of the standard library (``text_padding.docstrings``), drawn at
random: mixed lengths, median ~25 tokens, a long tail to 512.

1. Offline rate: the handler's path in this process (tokenize, collate, forward,
   postprocess; one torch thread, as a worker runs), a full batch (``max_batch``) of
   each bin the mix uses, timed twice after a warm-up; the rate over the mix is the
   jobs-weighted harmonic mean of the bins' rates. Measured again at the end: the
   report gives both and uses their mean.
2. For each checkout in ``--roots`` and each factor: a private redis-server, the web
   under gunicorn and one Celery worker serving minilm (``python -m`` from that
   root), each bin warmed with one job, then Poisson arrivals at factor × offline,
   each job ``POST /submit`` (``deadline_ms`` = the client's timeout) then long-polled,
   its client giving up ``--client-timeout-s`` after its arrival.

Goodput: jobs answered ``done`` in time per second, from the first arrival to the last
such answer. Work: the offline time of those jobs (each at its bin's full-batch time per
job) over the same span, so a run that refused the long texts and kept the short ones
does not look faster than the model (jobs/s alone would). Late: admitted (202) jobs not
answered ``done`` in time. Also: refusals by length (tokens: up to 32, to 128, more),
the worker's and the web's CPU (cores, over the same span), the mean batch size, and
per second of the run the jobs refused and the admitted jobs that ended late.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import requests
import torch
from overload import _p99_ms, _raise_open_files, local_stack  # this folder
from text_padding import docstrings  # this folder

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.bench.arrivals import Arrival, poisson_times
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.records import JobRecord, Outcome, Verdict, write_jsonl
from carpool.bench.workload import new_nonce
from carpool.core.catalogue import ModelSpec, builtin_models
from carpool.core.settings import load_settings
from carpool.core.tokens import tokenizer_for
from worker.handlers.text import TextHandler

MODEL = "minilm"
EMBEDDING_DIM = 384


@dataclass(frozen=True)
class Text:
    text: str
    tokens: int


@dataclass(frozen=True)
class RunResult:
    root: str
    factor: float
    offered: int
    admitted: int
    done_in_time: int
    late: int
    refused_429: int
    errors: int
    goodput_per_s: float
    offline_per_s: float
    goodput_ratio: float
    #: The on-time jobs' offline time over the span: the share of the model's capacity
    #: that went to answers in time, whatever the mix admitted.
    work_ratio: float
    late_share: float
    #: Share of the offered jobs refused, by tokens: "<=32", "33-128", ">128".
    refused_by_tokens: dict[str, float]
    worker_cores: float
    web_cores: float
    mean_batch: float
    #: The generator's own CPU (cores) over the run: it shares the machine.
    generator_cores: float
    #: p99 of how late the generator sent jobs after their scheduled arrival (ms).
    start_late_p99_ms: float
    #: The late jobs as Redis saw them: counts by status ("no id": the submit was
    #: never answered), and for those done the p50 of queue and admit-to-done ms.
    late_detail: dict[str, float]
    #: Per second of arrivals: [jobs refused, admitted jobs late].
    timeline: list[list[int]]


def load_texts(spec: ModelSpec) -> list[Text]:
    tokenizer = tokenizer_for(spec)
    return [Text(t, tokenizer.count(t)) for t in docstrings() if len(t.encode()) < 200_000]


def offline_ms_per_job(spec: ModelSpec, texts: Sequence[Text], reps: int = 2,
                       ) -> dict[str, float]:
    """Each bin's ms per job in a full batch, the handler alone, for the bins of ``texts``."""
    torch.set_num_threads(1)
    handler = TextHandler(spec, "cpu")
    handler.load()
    by_bin: dict[str, list[Text]] = {}
    for t in texts:
        by_bin.setdefault(spec.bin_for(t.tokens).name, []).append(t)
    ms_per_job: dict[str, float] = {}
    for name, members in by_bin.items():
        bin_spec = next(b for b in spec.bins if b.name == name)
        batch = [members[i % len(members)] for i in range(bin_spec.max_batch)]
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            items = [handler.preprocess({"text": t.text}) for t in batch]
            with torch.inference_mode():
                out = handler.forward(handler.collate(items, bin_spec))
            handler.postprocess(out, len(items))
            times.append(time.perf_counter() - t0)
        ms_per_job[name] = 1000 * statistics.mean(times[1:]) / len(batch)
    return ms_per_job


def offline_rate(spec: ModelSpec, texts: Sequence[Text], ms_per_job: dict[str, float],
                 ) -> float:
    """Jobs/s of the handler alone over the mix ``texts`` (the jobs-weighted harmonic
    mean of the bins' full-batch rates)."""
    total_ms = sum(ms_per_job[spec.bin_for(t.tokens).name] for t in texts)
    return 1000 * len(texts) / total_ms


def refused_by_tokens(records: Sequence[JobRecord]) -> dict[str, float]:
    """The share of offered jobs refused (429), by their token count."""
    groups = {"<=32": (0, 32), "33-128": (33, 128), ">128": (129, 1 << 30)}
    out = {}
    for name, (low, high) in groups.items():
        offered = [r for r in records if low <= r.size <= high]
        refused = sum(r.outcome is Outcome.REJECTED for r in offered)
        out[name] = round(refused / max(1, len(offered)), 3)
    return out


def judge(expected: dict[str, int]) -> Any:
    """Verify for the driver: done, this job's id, a unit vector of the right size."""

    def check(job_id: str, job_input: dict[str, Any], body: dict[str, Any]) -> Verdict:
        if body.get("id") != job_id:
            return Verdict(Outcome.MISROUTED, f"asked for {job_id}, got {body.get('id')}")
        if body.get("status") != "done":
            return Verdict(Outcome.FAILED, f"{body.get('status')}: {body.get('error', '')}"[:200])
        result = body.get("result") or {}
        if result.get("dim") != EMBEDDING_DIM or result.get("tokens") != expected.get(
                job_input["text"]):
            return Verdict(Outcome.MISROUTED, f"dim/tokens {result.get('dim')}/"
                           f"{result.get('tokens')}")
        return Verdict(Outcome.OK)

    return check


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_s(procs: Sequence[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            for q in [p, *p.children(recursive=True)]:
                c = q.cpu_times()
                total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def warm(base_url: str, spec: ModelSpec, texts: Sequence[Text]) -> None:
    """One job per bin the texts use, each waited for: every bin shape has run once."""
    seen: set[str] = set()
    for t in texts:
        name = spec.bin_for(t.tokens).name
        if name in seen:
            continue
        seen.add(name)
        r = requests.post(f"{base_url}/submit?wait=60", json={"model": MODEL,
                          "input": {"text": t.text}}, timeout=90)
        if r.status_code != 200 or r.json().get("status") != "done":
            raise RuntimeError(f"warm-up of {name}: {r.status_code} {r.text[:200]}")


def late_detail(redis_url: str, late_ids: Sequence[str], missing: int) -> dict[str, float]:
    """How the late jobs ended, from their records (read before the stack stops)."""
    queue = Queue(connect(redis_url), Keys(load_settings({}).key_prefix))
    found = queue.read_records(list(late_ids)) if late_ids else []
    out: dict[str, float] = {"no id": missing}
    waits, ends = [], []
    for fields in found:
        status = fields.get("status", "gone") if fields else "gone"
        out[status] = out.get(status, 0) + 1
        if fields:  # which bins miss: a bin served seldom waits past its prediction
            late_bin = f"bin {fields.get('bin', '?')}"
            out[late_bin] = out.get(late_bin, 0) + 1
        if fields and status == "done":
            waits.append(int(fields["t_claim"]) - int(fields["t_admit"]))
            ends.append(int(fields["t_done"]) - int(fields["t_admit"]))
    if waits:
        out["queue_ms_p50"] = statistics.median(waits)
        out["end_ms_p50"] = statistics.median(ends)
    return out


def summarise(root: str, factor: float, records: Sequence[JobRecord], offline: float,
              worker_cores: float, web_cores: float, generator_cores: float,
              detail: dict[str, float], job_ms: Any) -> RunResult:
    """``job_ms(tokens)``: a job's offline ms (its bin's full-batch ms per job)."""
    ok = [r for r in records if r.outcome is Outcome.OK]
    refused = [r for r in records if r.outcome is Outcome.REJECTED]
    errors = [r for r in records if r.outcome is Outcome.ERROR]
    admitted = [r for r in records if r.outcome not in (Outcome.REJECTED, Outcome.ERROR)]
    late = [r for r in admitted if r.outcome is not Outcome.OK]
    span = max((r.t_final or 0.0 for r in ok), default=0.0) - min(
        (r.t_sched for r in records), default=0.0)
    goodput = len(ok) / span if span > 0 else 0.0
    work = sum(job_ms(r.size) for r in ok) / 1000 / span if span > 0 else 0.0
    seconds = int(max((r.t_sched for r in records), default=0.0)) + 1
    timeline = [[0, 0] for _ in range(seconds)]
    for r in refused:
        timeline[int(r.t_sched)][0] += 1
    for r in late:
        timeline[int(r.t_sched)][1] += 1
    return RunResult(
        root=root, factor=factor, offered=len(records), admitted=len(admitted),
        done_in_time=len(ok), late=len(late), refused_429=len(refused), errors=len(errors),
        goodput_per_s=round(goodput, 1), offline_per_s=round(offline, 1),
        goodput_ratio=round(goodput / offline, 3), work_ratio=round(work, 3),
        late_share=round(len(late) / max(1, len(admitted)), 4),
        refused_by_tokens=refused_by_tokens(records),
        worker_cores=round(worker_cores, 2), web_cores=round(web_cores, 2),
        mean_batch=round(statistics.mean([r.batch_size for r in ok]), 1) if ok else 0.0,
        generator_cores=round(generator_cores, 2),
        start_late_p99_ms=_p99_ms([r.t_start - r.t_sched for r in records]),
        late_detail=detail, timeline=timeline)


def run_one(root: Path, factor: float, arrivals: Sequence[Arrival], texts: Sequence[Text],
            spec: ModelSpec, offline: float, ms_per_job: dict[str, float],
            args: argparse.Namespace) -> tuple[RunResult, list[JobRecord]]:
    tmp = Path(tempfile.mkdtemp(prefix="carpool-surge-"))
    with local_stack(root, tmp, {"CARPOOL_MODELS": MODEL}) as (redis_url, base_url, procs):
        warm(base_url, spec, texts)
        web, worker = psutil.Process(procs[0].pid), psutil.Process(procs[1].pid)
        web0, worker0, t0 = _cpu_s([web]), _cpu_s([worker]), time.monotonic()
        gen0 = _own_cpu_s()
        spy = None
        if args.profile:  # the worker's stacks over the surge (py-spy: pip install py-spy)
            args.profile.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                 str(procs[1].pid), "--rate", "50", "--format", "raw", "--duration",
                 str(int(args.duration)), "--output",
                 str(args.profile / f"{root.name}-{factor:g}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        opts = HttpOptions(base_url=base_url, model=MODEL,
                           client_timeout_s=args.client_timeout_s,
                           grace_s=args.client_timeout_s + 5, protocol="poll",
                           submit_connections=4096, poll_connections=4096,
                           job_input=lambda _n, _s, a: {"text": texts[int(a.payload)].text},
                           verify=judge({t.text: t.tokens for t in texts}))
        records = run_http(arrivals, opts, new_nonce())
        elapsed = time.monotonic() - t0
        if spy is not None:
            spy.wait(timeout=60)
        web_cores = (_cpu_s([web]) - web0) / elapsed
        worker_cores = (_cpu_s([worker]) - worker0) / elapsed
        generator_cores = (_own_cpu_s() - gen0) / elapsed
        late = [r for r in records if r.outcome not in (Outcome.OK, Outcome.REJECTED,
                                                        Outcome.ERROR)]
        # Read before the stack stops: the late jobs' records are in its Redis.
        detail = late_detail(redis_url, [r.job_id for r in late if r.job_id],
                             sum(not r.job_id for r in late))
    return summarise(str(root), factor, records, offline, worker_cores, web_cores,
                     generator_cores, detail,
                     lambda tokens: ms_per_job[spec.bin_for(tokens).name]), records


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--roots", default=".", help="comma-separated checkouts to compare")
    ap.add_argument("--factors", default="1.5,3", help="offered load, × the offline rate")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    ap.add_argument("--client-timeout-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--profile", type=Path,
                    help="record the worker with py-spy over the surge into this folder")
    ap.add_argument("--records", type=Path, help="write every job's record (JSON lines)")
    args = ap.parse_args(argv)
    spec = builtin_models()[MODEL]
    texts = load_texts(spec)
    rng = random.Random(args.seed)
    sample = [rng.choice(texts) for _ in range(2000)]
    ms_per_job = offline_ms_per_job(spec, texts)  # every bin an arrival may use
    offline_before = offline_rate(spec, sample, ms_per_job)
    print(json.dumps({"texts": len(texts), "offline_per_s": round(offline_before, 1)}),
          flush=True)
    _raise_open_files(16384)
    runs: list[tuple[RunResult, list[JobRecord]]] = []
    for factor in (float(f) for f in args.factors.split(",")):
        times = poisson_times(factor * offline_before, args.duration, args.seed)
        picks = random.Random(args.seed + 1)
        arrivals = []
        for t in times:
            i = picks.randrange(len(texts))
            arrivals.append(Arrival(t, texts[i].tokens, payload=i,
                                    deadline_ms=int(args.client_timeout_s * 1000)))
        for root in (Path(r).resolve() for r in args.roots.split(",")):
            runs.append(run_one(root, factor, arrivals, texts, spec, offline_before,
                                ms_per_job, args))
            print(json.dumps({k: v for k, v in asdict(runs[-1][0]).items() if k != "timeline"}),
                  flush=True)
    offline_after = offline_rate(spec, sample, offline_ms_per_job(spec, texts))
    offline = (offline_before + offline_after) / 2
    print(json.dumps({"offline_before": round(offline_before, 1),
                      "offline_after": round(offline_after, 1)}), flush=True)
    print(f"{'root':40s} {'x':>4s} {'offered':>7s} {'admit':>6s} {'late%':>6s} "
          f"{'good/s':>7s} {'ratio':>6s} {'work':>5s} {'wrk':>5s} {'web':>5s} {'gen':>5s} "
          f"{'batch':>5s}")
    results = []
    for result, _ in runs:
        ratio = result.goodput_per_s / offline
        result = RunResult(**{**asdict(result), "offline_per_s": round(offline, 1),
                              "goodput_ratio": round(ratio, 3)})
        results.append(result)
        print(f"{result.root[-40:]:40s} {result.factor:4g} {result.offered:7d} "
              f"{result.admitted:6d} {100 * result.late_share:6.1f} "
              f"{result.goodput_per_s:7.1f} {ratio:6.2f} {result.work_ratio:5.2f} "
              f"{result.worker_cores:5.2f} "
              f"{result.web_cores:5.2f} {result.generator_cores:5.2f} {result.mean_batch:5.1f}")
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.records:
        write_jsonl(args.records, ({"root": r.root, "factor": r.factor, **rec.to_json()}
                                   for r, records in runs for rec in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
