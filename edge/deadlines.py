"""Time limits for a request's stages (body, KV reads, the origin's answer) on one timer.

``asyncio.timeout`` arms a timer per use, and in Pyodide each one crosses into JS
(``setTimeout`` with a new callable proxy). A request's stages run one after
another, so one timer serves them all: it is armed at the first stage for the
shortest limit any stage has, and when it fires while a stage still has time left,
it is armed again for the rest of that stage's limit. A request that is done within
the shortest limit (nearly every one) arms one timer, not one per stage.

A stage may also have an alarm: a callback run once, on the same timer, when the stage
is still running after a delay (the forward's liveness probe). The alarm only moves
when the timer is armed next; ``cut`` ends a stage at once, as its limit would.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["DeadlineTimer", "Stage"]

# ``arm(delay_s, callback, token)`` calls ``callback(token)`` once the delay has passed.
Arm = Callable[[float, Callable[[int], None], int], object]

# A timer this close to the stage's end ends the stage (no re-arming for float dust).
_SLACK = 1e-6


def _loop_arm(delay: float, callback: Callable[[int], None], token: int) -> object:
    return asyncio.get_running_loop().call_later(delay, callback, token)


class DeadlineTimer:
    """Per isolate: ``async with timer.within(seconds):`` limits one stage of the current
    request (a task) and raises ``TimeoutError`` when it runs out, as ``asyncio.timeout``
    does. Stages run one at a time; ``shortest`` is the shortest limit any stage gets."""

    __slots__ = ("_arm", "_clock", "_current", "_shortest")

    def __init__(
        self,
        shortest: float,
        *,
        arm: Arm = _loop_arm,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shortest = shortest
        self._arm = arm
        self._clock = clock
        # Per task: concurrent requests in one isolate never share a timer.
        self._current: contextvars.ContextVar[_Timer | None] = contextvars.ContextVar(
            "prism_deadline_timer", default=None
        )

    def within(
        self,
        seconds: float,
        alarm: float | None = None,
        on_alarm: Callable[[Stage], None] | None = None,
    ) -> Stage:
        """A stage of at most ``seconds``; ``on_alarm(stage)`` runs once if it is still
        running after ``alarm`` seconds."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a stage time limit needs a running task")
        timer = self._current.get()
        if timer is None or timer.task is not task:
            timer = _Timer(task, self._shortest, self._arm, self._clock)
            self._current.set(timer)
        return Stage(timer, seconds, alarm, on_alarm)


class _Timer:
    """One request's timer: the running stage's end, and when the armed timer fires."""

    __slots__ = (
        "alarm_at",
        "arm",
        "armed",
        "cancelling",
        "clock",
        "deadline",
        "expired",
        "fires_at",
        "shortest",
        "stage",
        "task",
    )

    def __init__(
        self,
        task: asyncio.Task[object],
        shortest: float,
        arm: Arm,
        clock: Callable[[], float],
    ) -> None:
        self.task = task
        self.shortest = shortest
        self.arm = arm
        self.clock = clock
        self.deadline: float | None = None  # the running stage's end (None: none runs)
        self.fires_at = float("inf")  # when the armed timer fires (inf: none armed)
        self.armed = 0  # the token of the timer that counts; older ones are superseded
        self.expired = False
        self.cancelling = 0
        self.stage: Stage | None = None  # the running stage
        self.alarm_at = float("inf")  # when its alarm is due (inf: none, or rung)

    def start(self, stage: Stage) -> None:
        if self.deadline is not None:
            raise RuntimeError("stage time limits do not nest")
        now = self.clock()
        deadline = now + stage.seconds
        alarm = stage.alarm
        alarm_at = float("inf") if alarm is None else now + alarm
        first = stage.seconds if alarm is None else min(stage.seconds, alarm)
        if self.fires_at > now + first:  # none armed, or armed too late for this stage
            self.schedule(now, min(first, self.shortest))
        self.deadline = deadline
        self.alarm_at = alarm_at
        self.stage = stage
        self.expired = False
        self.cancelling = self.task.cancelling()

    def stop(self) -> None:
        self.deadline = None
        self.stage = None
        self.alarm_at = float("inf")

    def cut(self) -> None:
        self.expired = True
        self.task.cancel()

    def schedule(self, now: float, delay: float) -> None:
        delay = max(0.0, delay)
        self.armed += 1
        self.fires_at = now + delay
        self.arm(delay, self.fire, self.armed)

    def fire(self, token: int) -> None:
        if token != self.armed:
            return  # superseded by a timer armed for an earlier end
        # The timer waited its delay whatever the clock says: the Workers clock moves only
        # when I/O completes, so it may still show the time the timer was armed.
        now = max(self.clock(), self.fires_at)
        self.fires_at = float("inf")
        if self.deadline is None or self.task.done():
            return  # between stages, or after the answer: nothing to limit
        if now >= self.alarm_at - _SLACK:
            self.alarm_at = float("inf")
            stage = self.stage
            if stage is not None and stage.on_alarm is not None:
                stage.on_alarm(stage)
            if self.deadline is None or self.expired:
                return  # the alarm ended the stage
        if now < self.deadline - _SLACK:
            # The stage has time left (or an alarm to ring first).
            self.schedule(now, min(self.deadline, self.alarm_at) - now)
            return
        self.cut()


class Stage:
    __slots__ = ("_timer", "alarm", "on_alarm", "seconds")

    def __init__(
        self,
        timer: _Timer,
        seconds: float,
        alarm: float | None,
        on_alarm: Callable[[Stage], None] | None,
    ) -> None:
        self._timer = timer
        self.seconds = seconds
        self.alarm = alarm
        self.on_alarm = on_alarm

    @property
    def running(self) -> bool:
        return self._timer.stage is self

    def cut(self) -> None:
        """End the stage now (it raises ``TimeoutError``), if it is still running."""
        timer = self._timer
        if timer.stage is self and not timer.expired and not timer.task.done():
            timer.cut()

    async def __aenter__(self) -> Stage:
        self._timer.start(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        timer = self._timer
        timer.stop()
        if timer.expired:
            timer.expired = False
            # As asyncio.timeout decides: the cancel was ours, so it is a timeout, unless
            # the task was also cancelled from outside.
            if timer.task.uncancel() <= timer.cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
