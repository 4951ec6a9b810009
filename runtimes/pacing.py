"""The loop runner's waits (runtimes.loop): a sleep to a lead before the deadline, the warm-ups until the
deadline is one call away, a spin to it; the automatic lead and spin follow what they measure."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .policy import Policy

CALIBRATION_CALLS = 5
"""warm-up calls and short sleeps timed before the first deadline, to start the automatic lead and spin"""
WINDOW = 64
"""the automatic lead and spin follow the last WINDOW warm-ups and sleeps (p90 of the cold ones, p50 of
the warm ones): a loaded machine's rare outlier does not stretch them (a decaying maximum did, to 3 ms at
50 Hz, here)"""
WARM_CALLS = 8
"""the automatic lead leaves room for the first (cold) warm-up and this many more: after a sleep act()
here took 220 us, then 20, 13, 11 and 10.5 us (tight loop: 10.5 us), so one call is not enough"""
LEAD_MARGIN = 1.1
LEAD_SLACK_NS = 20_000
MIN_SPIN_NS = 5_000
"""the shortest automatic spin: the clock read and the loop itself take a few microseconds"""


class Quantile:
    """A quantile of the last WINDOW samples, recomputed every 8th sample (a sort of 64 floats, a few
    microseconds, between steps)."""

    def __init__(self, q: float) -> None:
        self.q = q
        self.samples: list[float] = []
        self.value = 0.0
        self._i = 0

    def add(self, x: float) -> None:
        if len(self.samples) < WINDOW:
            self.samples.append(x)
        else:
            self.samples[self._i % WINDOW] = x
        self._i += 1
        if self._i % 8 == 0 or len(self.samples) <= CALIBRATION_CALLS:
            ordered = sorted(self.samples)
            self.value = ordered[int(self.q * (len(ordered) - 1))]


class Pacer:
    """The waits between steps: a sleep to a lead before the deadline, warm-ups until the deadline is one
    call away, a spin to it; without a warm-up, a sleep to a spin before the deadline, and the spin."""

    def __init__(
        self, policy: Policy, hz: float, warmup: bool, lead_us: float | None, spin_us: float | None
    ) -> None:
        self.policy, self.warmup = policy, warmup
        self.period = round(1e9 / hz)
        self.fixed_lead = None if lead_us is None else round(lead_us * 1e3)
        self.fixed_spin = None if spin_us is None else round(spin_us * 1e3)
        self.first = Quantile(0.9)  # the wake-up delay and the first, cold warm-up, from its due time
        self.call = Quantile(0.5)  # a warm-up after the first
        self.wake = Quantile(0.9)  # a sleep's wake-up delay
        self.missed = 0

    def calibrate(self, obs: Any) -> None:
        """Start the automatic lead and spin from a few timed warm-ups and short sleeps."""
        clock, rehearse = time.monotonic_ns, self.policy.rehearse
        for _ in range(CALIBRATION_CALLS):
            target = clock() + 100_000
            time.sleep(1e-4)
            t0 = clock()
            self.wake.add(float(t0 - target))
            if obs is None:
                continue
            rehearse(obs)
            t1 = clock()
            rehearse(obs)
            self.call.add(float(clock() - t1))
            # a cold call costs several warm ones (the figure this runner exists for): start high, the
            # loop's own warm-ups replace these within a few periods
            self.first.add(float(t0 - target) + 4.0 * (t1 - t0))

    @property
    def spin(self) -> int:
        if self.fixed_spin is not None:
            return self.fixed_spin
        return min(self.period // 4, max(MIN_SPIN_NS, round(LEAD_MARGIN * self.wake.value)))

    @property
    def lead(self) -> int:
        if self.fixed_lead is not None:
            return self.fixed_lead
        want = LEAD_MARGIN * self.first.value + WARM_CALLS * self.call.value + LEAD_SLACK_NS
        return min(self.period // 2, round(want))

    def wait(self, deadline: int, obs: Any) -> tuple[int, int]:
        """Wait for ``deadline``, warming up first when there is an observation and time for it; returns
        the time the warm-ups took (ns) and their number (0, 0: none ran)."""
        clock = time.monotonic_ns
        if self.warmup and obs is not None:
            at = deadline - self.lead
            now = clock()
            if now < at:
                rehearse = self.policy.rehearse
                time.sleep((at - now) / 1e9)
                t0 = clock()
                rehearse(obs)
                now = clock()
                self.first.add(float(now - at))
                calls, room = 1, 2 * self.call.value
                while now + room < deadline:  # warm until one more call might not fit
                    rehearse(obs)
                    t = clock()
                    self.call.add(float(t - now))
                    now, calls = t, calls + 1
                while clock() < deadline:  # no sleep after the warm-up: a sleep would cool what it warmed
                    pass
                return now - t0, calls
            self.missed += 1
        spin = self.spin
        target = deadline - spin
        now = clock()
        if target > now:
            time.sleep((target - now) / 1e9)
            if self.fixed_spin is None:
                self.wake.add(float(clock() - target))
        while clock() < deadline:
            pass
        return 0, 0
