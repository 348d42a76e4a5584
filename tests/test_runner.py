"""The batch runner: one result per job, in order; one bad input fails alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from carpool.catalogue import BinSpec, load_catalogue
from carpool.jobs import ClaimedJob
from carpool.synthetic import expected_result
from worker.handlers.synthetic import SyntheticHandler
from worker.runner import run_batch

SPEC = load_catalogue(None).get("synthetic")
BIN = SPEC.bins[0]


def job(i: int, payload: Any) -> ClaimedJob:
    return ClaimedJob(f"id{i}", json.dumps(payload), admit_ms=0, attempts=1)


def test_every_job_gets_its_own_result_in_order() -> None:
    jobs = [job(i, {"value": i, "size": 1}) for i in range(5)]
    outs = run_batch(SyntheticHandler(SPEC, (0, 0)), BIN, jobs)
    assert [o.id for o in outs] == [j.id for j in jobs]
    assert [o.result for o in outs] == [expected_result({"value": i, "size": 1}) for i in range(5)]


def test_an_input_that_breaks_preprocessing_fails_alone() -> None:
    jobs = [job(0, {"value": 0, "size": 1}), job(1, "not an object"),
            job(2, {"value": 2, "size": 1})]
    outs = run_batch(SyntheticHandler(SPEC, (0, 0)), BIN, jobs)
    assert [o.failed for o in outs] == [False, True, False]
    assert outs[1].error is not None and "preprocess failed" in outs[1].error
    assert outs[2].result == expected_result({"value": 2, "size": 1})


class ShortHandler(SyntheticHandler):
    """Returns one result too few: the runner must notice, not misassign."""

    def postprocess(self, output: list[dict[str, Any]], n: int) -> list[Any]:
        return list(output)[:-1]


def test_a_handler_returning_the_wrong_number_of_results_fails_the_batch_loudly() -> None:
    jobs = [job(i, {"value": i, "size": 1}) for i in range(3)]
    outs = run_batch(ShortHandler(SPEC, (0, 0)), BIN, jobs)
    assert all(o.failed and "returned 2 results for a batch of 3" in (o.error or "") for o in outs)


class CountingHandler(SyntheticHandler):
    def __init__(self) -> None:
        super().__init__(SPEC, (0, 0))
        self.collated: list[int] = []

    def collate(self, items: Sequence[dict[str, Any]], bin_spec: BinSpec) -> list[dict[str, Any]]:
        self.collated.append(len(items))
        return super().collate(items, bin_spec)


def test_failed_preprocessing_leaves_the_job_out_of_the_forward_pass() -> None:
    handler = CountingHandler()
    run_batch(handler, BIN, [job(0, {"value": 0, "size": 1}), job(1, [])])
    assert handler.collated == [1]
