"""The one bounded wait (carpool/stack/waiting.py): returns, times out, gives up early."""

from __future__ import annotations

import pytest

from carpool.stack.waiting import wait_until


def test_returns_once_the_condition_holds_pausing_between_tries() -> None:
    answers = iter([False, False, True])
    pauses: list[float] = []
    wait_until(lambda: next(answers), 60, "the third try", pause=pauses.append, poll_s=0.5)
    assert pauses == [0.5, 0.5]


def test_times_out_naming_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match="waiting for redis-server to answer"):
        wait_until(lambda: False, 0, "redis-server to answer", pause=lambda _: None)


def test_a_check_that_raises_gives_up_before_the_timeout() -> None:
    class Died(Exception):
        pass

    tries: list[int] = []

    def died() -> None:
        tries.append(1)
        if len(tries) == 2:
            raise Died

    with pytest.raises(Died):
        wait_until(lambda: False, 60, "a process that dies", check=died, pause=lambda _: None)
    assert len(tries) == 2
