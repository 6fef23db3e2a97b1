"""The per-request stage timer: asyncio.timeout's behaviour, one timer per fast request.

The runtime tests (the 408 on a stalled body, the 504 on a silent origin, a KV read
past its limit) are in test_adversarial and test_failures_told; these pin the timer
itself in CPython, with a counting ``arm`` and, where it matters, a clock that stands
still as the Workers clock does between I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from edge.deadlines import DeadlineTimer


class Arms:
    """``call_later`` that counts how many timers were armed, and for how long."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, delay: float, callback: Callable[[int], None], token: int) -> object:
        self.delays.append(delay)
        return asyncio.get_running_loop().call_later(delay, callback, token)


async def test_a_fast_request_arms_one_timer_for_all_its_stages() -> None:
    arms = Arms()
    timer = DeadlineTimer(0.5, arm=arms)
    for seconds in (10.0, 0.5, 0.5, 90.0):  # body, policy, KV, origin
        async with timer.within(seconds):
            await asyncio.sleep(0)
    assert arms.delays == [0.5]


async def test_a_stage_past_its_limit_raises_timeout_error() -> None:
    timer = DeadlineTimer(0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with timer.within(0.05):
            await asyncio.sleep(5)
    assert 0.04 < loop.time() - started < 2


async def test_a_longer_stage_gets_its_whole_limit_from_a_rearmed_timer() -> None:
    arms = Arms()
    timer = DeadlineTimer(0.02, arm=arms)
    async with timer.within(2.0):  # outlives the first timer (0.02 s): armed again
        await asyncio.sleep(0.1)
    assert len(arms.delays) == 2 and arms.delays[0] == 0.02
    with pytest.raises(TimeoutError):
        async with timer.within(0.05):
            await asyncio.sleep(5)


async def test_a_later_stage_is_limited_from_its_own_start() -> None:
    timer = DeadlineTimer(0.2)
    async with timer.within(5.0):
        await asyncio.sleep(0.1)
    # The first timer fires about 0.1 s into this stage: early, so it is armed again.
    async with timer.within(1.0):
        await asyncio.sleep(0.2)


async def test_a_timer_ends_a_stage_even_when_the_clock_stands_still() -> None:
    frozen = 1000.0
    timer = DeadlineTimer(0.02, clock=lambda: frozen)
    with pytest.raises(TimeoutError):
        async with timer.within(0.05):  # armed for 0.02 s, then for the other 0.03 s
            await asyncio.sleep(5)


async def test_a_stage_shorter_than_the_armed_timer_arms_its_own() -> None:
    arms = Arms()
    timer = DeadlineTimer(10.0, arm=arms)
    async with timer.within(10.0):
        await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with timer.within(0.02):
            await asyncio.sleep(5)
    assert arms.delays[:2] == [10.0, 0.02]


async def test_concurrent_requests_keep_their_own_timers() -> None:
    timer = DeadlineTimer(0.05)

    slow_timed_out = asyncio.Event()

    async def slow() -> str:
        try:
            async with timer.within(0.05):
                await asyncio.sleep(5)
        except TimeoutError:
            slow_timed_out.set()
            return "timed out"
        return "done"

    async def fast() -> str:
        async with timer.within(0.05):
            await asyncio.sleep(0)
        await slow_timed_out.wait()  # between stages: the other request's timeout is not ours
        async with timer.within(1.0):
            await asyncio.sleep(0)
        return "done"

    assert list(await asyncio.gather(slow(), fast())) == ["timed out", "done"]  # typed a tuple


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    timer = DeadlineTimer(5.0)

    entered = asyncio.Event()

    async def request() -> None:
        async with timer.within(5.0):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.ensure_future(request())
    await entered.wait()  # inside the stage, its timer armed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_stages_do_not_nest() -> None:
    timer = DeadlineTimer(1.0)
    async with timer.within(1.0):
        with pytest.raises(RuntimeError, match="nest"):
            async with timer.within(1.0):
                pass


def test_a_stage_needs_a_task() -> None:
    with pytest.raises(RuntimeError):
        DeadlineTimer(1.0).within(1.0)


class ManualTimers:
    """The timers and the clock a ``DeadlineTimer`` sees, moved by the test: each armed
    timer fires when the test says, its delay added to the clock, as the loop would."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed: list[tuple[float, Callable[[int], None], int]] = []

    def arm(self, delay: float, callback: Callable[[int], None], token: int) -> object:
        self.armed.append((delay, callback, token))
        return None

    def fire_last(self) -> None:
        delay, callback, token = self.armed[-1]
        self.now += delay
        callback(token)


async def test_an_alarm_rings_once_on_the_same_timer_while_the_stage_runs() -> None:
    timers = ManualTimers()
    timer = DeadlineTimer(0.02, arm=timers.arm, clock=lambda: timers.now)
    rung: list[float] = []
    async with timer.within(0.3, 0.1, lambda stage: rung.append(timers.now)) as stage:
        timers.fire_last()  # the shortest limit's timer: nothing due yet
        assert rung == []
        timers.fire_last()  # the alarm's
        assert stage.running
    assert rung == [pytest.approx(0.1)]
    # armed at the shortest limit, again for the alarm, again for the stage's rest (not
    # for another alarm: it rings once)
    assert [round(delay, 6) for delay, _, _ in timers.armed] == [0.02, 0.08, 0.2]


async def test_an_alarm_of_a_stage_that_ended_first_never_rings() -> None:
    timers = ManualTimers()
    timer = DeadlineTimer(0.01, arm=timers.arm, clock=lambda: timers.now)
    rung: list[object] = []
    async with timer.within(5.0, 0.05, rung.append):
        pass
    timers.now = 0.1  # past the alarm's time, every timer armed fires
    for _, callback, token in list(timers.armed):
        callback(token)
    assert timers.armed and rung == []


async def test_a_cut_ends_the_stage_at_once_as_its_limit_would() -> None:
    timer = DeadlineTimer(0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with timer.within(30.0, 0.05, lambda stage: stage.cut()) as stage:
            assert stage.running
            await asyncio.sleep(5)
    assert loop.time() - started < 2
    assert not stage.running
    async with timer.within(0.5):  # the next stage is not cut
        await asyncio.sleep(0.01)
