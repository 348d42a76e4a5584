"""The online fit of t(n) = a + b·n: exact on clean data, follows change, seeded."""

import pytest

from carpool.scheduling.batching import Cost
from carpool.scheduling.costmodel import CostModel


def test_nothing_is_known_before_a_batch_or_a_seed() -> None:
    assert CostModel().cost() is None


def test_two_batch_sizes_give_the_exact_line() -> None:
    model = CostModel()
    for n in (1, 8, 4, 16, 2):
        model.observe(n, 20.0 + 1.5 * n)
    cost = model.cost()
    assert cost is not None
    assert (cost.a_ms, cost.b_ms) == (pytest.approx(20.0), pytest.approx(1.5))


def test_one_batch_size_only_keeps_the_seed_slope_or_none() -> None:
    plain = CostModel()
    for _ in range(5):
        plain.observe(1, 21.0)
    assert plain.cost() == Cost(pytest.approx(21.0), 0.0)  # type: ignore[arg-type]
    seeded = CostModel(seed=Cost(10.0, 2.0))  # a seed's slope, without its points
    for _ in range(5):
        seeded.observe(4, 30.0)
    assert seeded.cost() == Cost(pytest.approx(22.0), 2.0)  # type: ignore[arg-type]


def test_a_fading_seed_still_tells_the_slope_that_small_batches_alone_cannot() -> None:
    model = CostModel.seeded(Cost(10.0, 2.0), max_batch=32)
    for _ in range(200):
        model.observe(1, 30.0)
    cost = model.cost()
    assert cost is not None and cost.b_ms > 0
    assert cost.ms(1) == pytest.approx(30.0, rel=0.01)


def test_a_seed_stands_until_batches_outweigh_it() -> None:
    model = CostModel.seeded(Cost(10.0, 2.0), max_batch=32)
    assert model.cost() == Cost(pytest.approx(10.0), pytest.approx(2.0))  # type: ignore[arg-type]
    for i in range(400):
        model.observe(1 + i % 32, 30.0 + 0.5 * (1 + i % 32))
    cost = model.cost()
    assert cost is not None
    assert (cost.a_ms, cost.b_ms) == (pytest.approx(30.0, rel=0.01), pytest.approx(0.5, rel=0.02))


def test_the_fit_follows_a_model_that_became_slower() -> None:
    model = CostModel()
    for i in range(200):
        model.observe(1 + i % 16, 10.0 + 1.0 * (1 + i % 16))
    for i in range(400):
        model.observe(1 + i % 16, 30.0 + 2.0 * (1 + i % 16))
    cost = model.cost()
    assert cost is not None and cost.ms(8) == pytest.approx(46.0, rel=0.01)


def test_data_without_a_fixed_part_fit_through_the_origin() -> None:
    model = CostModel()
    for n, t in ((1, 0.5), (10, 20.0), (20, 40.0)):
        model.observe(n, t)
    cost = model.cost()
    assert cost is not None and cost.a_ms == 0.0 and cost.b_ms > 0
