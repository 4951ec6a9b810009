"""The control loop: a fixed-rate loop runner (``run_loop``, and ``Pace`` for a loop another function drives).

``run_loop(policy, LoopConfig(hz=50, steps=1000), env=env)`` (or ``read_obs=``/``write_action=`` callbacks
for a robot's own sensors and actuators) runs ``policy.act`` once per period on absolute deadlines of the
monotonic clock:

- **skip, never burst**: a step whose work (read, act, write) ends after the next deadline is an overrun;
  the loop then waits for the first deadline still ahead and counts the periods it skipped, so it never
  runs two steps back to back to catch up;
- **pre-deadline warm-up**: from a lead before each deadline, throw-away act() calls on the last
  observation (``Policy.rehearse``: no effect on the policy's state, stats or log) until the deadline is
  one call away bring the code and data act() needs back into the caches; the lead follows the measured
  cost of those calls and the sleep's wake-up delay unless it is given (runtimes.pacing);
- **a final spin** to the deadline: the sleep ends a little early (the measured wake-up delay) and the
  rest is a busy wait, so the step starts on time;
- **OS settings** (runtimes.realtime): CPU affinity, SCHED_FIFO, mlockall, a 1 ns timer slack and a
  frozen garbage collector during the loop, each reported as applied or why not, undone at the end.

Why: after a sleep the caches, TLB and branch predictors are cold and the core may have clocked down.
Measured here before this runner (CartPole int8): act() p50 17 us in a tight loop, 219-234 us in a loop
that sleeps to 50 Hz.

What ``bench --hz`` reports of the steps it paces with ``Pace`` is runtimes.inloop.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InputError
from .inloop import check_hz
from .pacing import Pacer
from .realtime import OsSetting, RealtimeConfig, RealtimeSession
from .schema import JSONObject

if TYPE_CHECKING:
    from .policy import Action, Policy

# ---- the loop runner ----------------------------------------------------------------------------------


def _check_us(value: Any, name: str, period_us: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < period_us:
        raise InputError(f"{name} must be None (automatic) or 0 to below the period, {period_us:g} us "
                         f"(got {str(value)[:24]!r})", f"e.g. {name}=None")  # fmt: skip
    return float(value)


@dataclass(frozen=True)
class LoopConfig:
    """How ``run_loop`` paces a policy."""

    hz: float
    """control rate, steps per second"""
    steps: int | None = None
    """steps to run; None: until the env's episodes (``seeds``) end (an env is then required)"""
    warmup: bool = True
    """a throw-away act() on the last observation a lead before each deadline"""
    lead_us: float | None = None
    """the warm-up's lead before the deadline; None: automatic (the measured warm-up cost and wake-up
    delay, with a margin, at most half the period)"""
    spin_us: float | None = None
    """the busy wait before the deadline; None: automatic (the measured wake-up delay of a sleep); 0: the
    loop sleeps to the deadline itself"""
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    """the OS settings to ask for (affinity, SCHED_FIFO, mlockall, timer slack, frozen GC)"""

    def __post_init__(self) -> None:
        hz = float(check_hz(self.hz, "hz", "hz=50", required=True) or 0)
        object.__setattr__(self, "hz", hz)
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int)
                                       or self.steps < 1):  # fmt: skip
            raise InputError(f"steps must be an integer >= 1 or None (got {str(self.steps)[:24]!r})",
                             "e.g. steps=1000")  # fmt: skip
        if not isinstance(self.warmup, bool):
            raise InputError(
                f"warmup must be True or False (got {str(self.warmup)[:24]!r})", "e.g. warmup=True"
            )
        period_us = 1e6 / hz
        object.__setattr__(self, "lead_us", _check_us(self.lead_us, "lead_us", period_us))
        object.__setattr__(self, "spin_us", _check_us(self.spin_us, "spin_us", period_us))
        if not isinstance(self.realtime, RealtimeConfig):
            raise InputError("realtime must be a RealtimeConfig", "e.g. realtime=RealtimeConfig.off()")

    @classmethod
    def plain(cls, hz: float, steps: int | None = None) -> LoopConfig:
        """The loop most control scripts are: act, then sleep to the next deadline (no warm-up, no spin,
        no OS settings). The 'before' of docs/runtime.md's table."""
        return cls(hz, steps, warmup=False, spin_us=0.0, realtime=RealtimeConfig.off())


@dataclass(frozen=True)
class Percentiles:
    """A distribution of times, in microseconds."""

    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    mean_us: float

    @classmethod
    def of_ns(cls, ns: np.ndarray) -> Percentiles | None:
        if ns.size == 0:
            return None
        us = ns.astype(np.float64) / 1e3
        p50, p90, p99 = np.percentile(us, (50, 90, 99))
        return cls(int(us.size), float(p50), float(p90), float(p99), float(us.max()), float(us.mean()))

    def __post_init__(self) -> None:
        values = (self.p50_us, self.p90_us, self.p99_us, self.max_us, self.mean_us)
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0 or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in values):  # fmt: skip
            raise ValueError(
                f"Percentiles: a count >= 0 and finite times >= 0 (got {self.count!r}, {values!r})"
            )
        if not self.p50_us <= self.p90_us <= self.p99_us <= self.max_us:
            raise ValueError("Percentiles: p50 <= p90 <= p99 <= max")

    def to_dict(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Percentiles:
        if not isinstance(d, dict):
            raise ValueError("percentiles are not an object")
        fields: dict[str, Any] = {
            k: d.get(k) for k in ("count", "p50_us", "p90_us", "p99_us", "max_us", "mean_us")
        }
        return cls(**fields)


@dataclass(frozen=True)
class LoopTrace:
    """Every step of a loop, in order (nanoseconds on the monotonic clock)."""

    deadline_ns: np.ndarray
    """the step's deadline, from the first deadline"""
    start_ns: np.ndarray
    """when the step started, from the first deadline (>= its deadline: the loop never starts early)"""
    act_ns: np.ndarray
    """act() alone"""
    work_ns: np.ndarray
    """read_obs + act + write_action (for an env: env.step, and env.reset at an episode's end)"""
    warmup_ns: np.ndarray
    """the warm-ups before this step's deadline, all of them (0: none ran)"""
    warmup_calls: np.ndarray
    """how many throw-away act() calls that was"""


@dataclass(frozen=True)
class LoopResult:
    """What ``run_loop`` measured. Times are act() alone unless named otherwise."""

    hz: float
    period_us: float
    steps: int
    overruns: int
    """steps whose work ended after the next deadline"""
    skipped_periods: int
    """deadlines passed over after overruns (the loop never bursts to catch up)"""
    act: Percentiles
    lateness: Percentiles
    """step start minus its deadline: how late the loop woke up (the spin makes it ~0)"""
    jitter: Percentiles | None
    """|start-to-start interval - period| between consecutive steps with no skipped period"""
    work: Percentiles
    """read_obs + act + write_action"""
    warmup: bool
    warmup_cost: Percentiles | None
    """the throw-away act() calls before each deadline, their time together (None: no warm-up ran): the CPU
    time the warm-up spends per period"""
    warmup_calls: float
    """throw-away act() calls per warmed-up period, on average"""
    warmups_missed: int
    """periods whose step ended too late to leave the lead for a warm-up"""
    lead_us: float
    """the warm-up lead at the end of the loop (the given one, or where the automatic one settled)"""
    spin_us: float
    settings: tuple[OsSetting, ...]
    returns: tuple[float, ...] = ()
    """episode returns, in order (env only: the episodes that ended)"""
    lengths: tuple[int, ...] = ()
    trace: LoopTrace | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        counts = (self.steps, self.overruns, self.skipped_periods, self.warmups_missed)
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
            raise ValueError(f"LoopResult counts must be integers >= 0: {counts}")
        if not (self.hz > 0 and self.period_us > 0 and self.overruns <= self.steps):
            raise ValueError("LoopResult: a rate above 0 and no more overruns than steps")

    @property
    def overrun_rate(self) -> float:
        return self.overruns / self.steps if self.steps else 0.0

    def to_dict(self) -> JSONObject:
        d = {k: v for k, v in asdict(self).items() if k not in ("trace", "settings")}
        d["settings"] = [s.to_dict() for s in self.settings]
        d["returns"], d["lengths"] = list(self.returns), list(self.lengths)
        return d


class EnvDriver:
    """A gymnasium env as the loop's sensors and actuators: ``read_obs`` gives the observation of the
    last step, ``write_action`` steps the env (and resets it, with the next seed, at an episode's end)."""

    def __init__(self, env: Any, policy: Policy, seeds: Sequence[int | None], max_steps: int | None) -> None:
        if not seeds:
            raise InputError("seeds is empty", "pass at least one seed, e.g. seeds=[0]")
        self.env, self.policy, self.seeds, self.max_steps = env, policy, list(seeds), max_steps
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.done = False
        self._episode = 0
        self._ret, self._len = 0.0, 0
        self.obs = self._reset()

    def _reset(self) -> Any:
        seed = self.seeds[self._episode]
        obs, _ = self.env.reset(seed=seed)
        if seed is not None:  # as the bench's episodes do: the same env randomness on the same seed
            self.env.action_space.seed(seed)
        self.policy.reset()
        return obs

    def read_obs(self) -> Any:
        return self.obs

    def write_action(self, action: Any) -> None:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        self._ret += float(reward)
        self._len += 1
        self.obs = obs
        if terminated or truncated or (self.max_steps is not None and self._len >= self.max_steps):
            self.returns.append(self._ret)
            self.lengths.append(self._len)
            self._ret, self._len = 0.0, 0
            self._episode += 1
            if self._episode < len(self.seeds):
                self.obs = self._reset()
            else:
                self.done = True


class Pace:
    """The loop runner's pacing for a loop another function drives (the bench's seeded episodes):

        with Pace(policy, cfg) as pace:
            for each step:
                pace.wait(last_obs)        # the warm-up, the sleep, the spin: returns at the step's deadline
                ... read, act (timed: act_ns), write ...
                pace.done(act_ns)          # the step's end: overrun? the next deadline
        result = pace.result()

    The OS settings of ``cfg.realtime`` hold between ``__enter__`` and ``__exit__`` (undone on any exit).
    ``alternate``: the warm-up before every other step only (``warmed`` says which), so that one run
    measures act() with and without it side by side (``bench --hz``)."""

    def __init__(self, policy: Policy, cfg: LoopConfig, alternate: bool = False) -> None:
        if not isinstance(cfg, LoopConfig):
            raise InputError("cfg must be a LoopConfig", "e.g. LoopConfig(hz=50, steps=1000)")
        self.cfg, self.alternate = cfg, alternate
        self.warmed = False
        """whether a warm-up ran before the step ``wait`` last returned for (not: none was due, or the
        step before ended too late for one)"""
        self._pacer = Pacer(policy, cfg.hz, cfg.warmup, cfg.lead_us, cfg.spin_us)
        self._session = RealtimeSession(cfg.realtime)
        self._rec = {k: array("q") for k in ("deadline", "start", "act", "work", "warmup", "calls")}
        self.settings: tuple[OsSetting, ...] = ()
        self.overruns = self.skipped = self.steps = 0
        self._first: int | None = None
        self._deadline = self._start = self._warm = self._calls = 0

    def __enter__(self) -> Pace:
        self.settings = self._session.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        self._session.restore()

    def wait(self, obs: Any) -> None:
        """Return at the next step's deadline (never before it), after the warm-up on ``obs`` (the last
        observation acted on; None: no warm-up)."""
        clock = time.monotonic_ns
        if self._first is None:
            self._pacer.calibrate(obs)
            self._first = self._deadline = clock() + self._pacer.period
        if self.alternate and self.steps % 2:
            obs = None
        self._warm, self._calls = self._pacer.wait(self._deadline, obs)
        self.warmed = self._calls > 0
        self._start = clock()

    def done(self, act_ns: int) -> bool:
        """The step's work ended now (``act_ns``: its act() alone): record it, set the next deadline;
        whether the step overran (its work ended after the next deadline)."""
        end = time.monotonic_ns()
        first, deadline, period, rec = self._first or 0, self._deadline, self._pacer.period, self._rec
        for key, value in (("deadline", deadline - first), ("start", self._start - first), ("act", act_ns),
                           ("work", end - self._start), ("warmup", self._warm), ("calls", self._calls)):  # fmt: skip
            rec[key].append(value)
        self.steps += 1
        deadline += period
        late = end > deadline
        if late:  # overrun: the first deadline still ahead, never a burst of late steps
            missed = (end - deadline) // period + 1
            self.overruns += 1
            self.skipped += missed
            deadline += missed * period
        self._deadline = deadline
        return late

    def result(self, returns: Sequence[float] = (), lengths: Sequence[int] = ()) -> LoopResult:
        return _result(self.cfg, self._pacer, self.settings, self._rec, self.overruns, self.skipped,
                       tuple(returns), tuple(lengths))  # fmt: skip


def run_loop(
    policy: Policy,
    cfg: LoopConfig,
    *,
    env: Any = None,
    seeds: Sequence[int | None] = (0,),
    max_steps: int | None = None,
    read_obs: Callable[[], Any] | None = None,
    write_action: Callable[[Action], Any] | None = None,
) -> LoopResult:
    """Run ``policy`` at ``cfg.hz`` on absolute deadlines, driving ``env`` (a gymnasium env: episodes on
    ``seeds`` in order, each capped at ``max_steps``) or the callbacks ``read_obs() -> obs`` and
    ``write_action(action)``. Runs ``cfg.steps`` steps (None: until the env's episodes end). The OS
    settings of ``cfg.realtime`` hold during the loop only; every one is reported in the result."""
    if not isinstance(cfg, LoopConfig):
        raise InputError("cfg must be a LoopConfig", "e.g. LoopConfig(hz=50, steps=1000)")
    if (env is None) == (read_obs is None or write_action is None) or (
            env is not None and (read_obs is not None or write_action is not None)):  # fmt: skip
        raise InputError("run_loop drives either env= or both read_obs= and write_action=",
                         "e.g. run_loop(policy, cfg, env=policy.make_env())")  # fmt: skip
    if cfg.steps is None and env is None:
        raise InputError("steps=None runs until the env's episodes end, and there is no env",
                         "give LoopConfig(steps=N) with callbacks")  # fmt: skip
    driver = EnvDriver(env, policy, seeds, max_steps) if env is not None else None
    if driver is not None:
        read_obs, write_action = driver.read_obs, driver.write_action
    assert read_obs is not None and write_action is not None  # checked above
    clock, act = time.monotonic_ns, policy.act
    limit = cfg.steps if cfg.steps is not None else 2**62
    last = driver.obs if driver is not None else None
    with Pace(policy, cfg) as pace:
        while pace.steps < limit and not (driver is not None and driver.done):
            pace.wait(last)
            obs = read_obs()
            t0 = clock()
            action = act(obs)
            t1 = clock()
            write_action(action)
            pace.done(t1 - t0)
            last = obs
    if driver is None:
        return pace.result()
    return pace.result(driver.returns, driver.lengths)


def _result(cfg: LoopConfig, pacer: Pacer, settings: tuple[OsSetting, ...], rec: dict[str, array],
            overruns: int, skipped: int, returns: tuple[float, ...], lengths: tuple[int, ...]) -> LoopResult:  # fmt: skip
    a = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64) for k, v in rec.items()}
    trace = LoopTrace(a["deadline"], a["start"], a["act"], a["work"], a["warmup"], a["calls"])
    gaps = np.diff(trace.deadline_ns)
    on_grid = gaps == pacer.period  # consecutive steps with no skipped period between them
    jitter = np.abs(np.diff(trace.start_ns)[on_grid] - pacer.period)
    empty = Percentiles(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return LoopResult(
        hz=cfg.hz,
        period_us=pacer.period / 1e3,
        steps=int(trace.act_ns.size),
        overruns=overruns,
        skipped_periods=skipped,
        act=Percentiles.of_ns(trace.act_ns) or empty,
        lateness=Percentiles.of_ns(trace.start_ns - trace.deadline_ns) or empty,
        jitter=Percentiles.of_ns(jitter),
        work=Percentiles.of_ns(trace.work_ns) or empty,
        warmup=cfg.warmup,
        warmup_cost=Percentiles.of_ns(trace.warmup_ns[trace.warmup_calls > 0]),
        warmup_calls=float(trace.warmup_calls[trace.warmup_calls > 0].mean())
        if trace.warmup_calls.any()
        else 0.0,
        warmups_missed=pacer.missed,
        lead_us=pacer.lead / 1e3 if cfg.warmup else 0.0,
        spin_us=pacer.spin / 1e3,
        settings=settings,
        returns=returns,
        lengths=lengths,
        trace=trace,
    )
