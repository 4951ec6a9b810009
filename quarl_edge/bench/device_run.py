"""What a device's runner sent for one model, typed: its episodes and its measurements (the JSON of
runtimes.runner.ModelRun and EpisodeResult, from a child process here or a board over SSH). Read with every
field checked where it arrives (a board is not trusted to send numbers that mean what they say), kept in
the partial bench file as JSON, and merged into the bench report (bench/run.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quarl_edge.bench.result import NAME_MAX, Latency, LinkTiming, in_loop_from_dict, sustained_from_dict
from quarl_edge.runtimes.inloop import InLoopStats
from quarl_edge.runtimes.sustained import SustainedStats
from quarl_edge.typed import (
    OMIT_NONE,
    build,
    flag,
    integer,
    items,
    number,
    obj,
    opt_number,
    opt_text,
    optional,
    text,
    tuple_of,
)

MAX_EPISODES = 1_000_000
MAX_STEPS_TIMED = 10_000_000


def _act_ns(v: object, name: str) -> tuple[int, ...] | None:
    """An episode's act() times (bench --hz): null, or nanosecond counts."""
    if v is None:
        return None
    times = items(v, name, MAX_STEPS_TIMED)
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**62 for t in times):
        raise ValueError(f"{name} holds something other than nanosecond counts")
    return times


def _warmed(v: object, name: str) -> tuple[bool, ...] | None:
    """An episode's per-step warm-up flags (bench --hz): null, or true/false per step."""
    if v is None:
        return None
    flags = items(v, name, MAX_STEPS_TIMED)
    if not all(isinstance(f, bool) for f in flags):
        raise ValueError(f"{name} holds something other than true/false")
    return flags


@dataclass(frozen=True)
class Episode:
    """One closed-loop episode as the runner reports it."""

    seed: int
    ret: float | None
    """its return (up to a failure); None: not a finite number"""
    length: int = 0
    nonfinite_obs: int = 0
    error: str | None = None
    act_ns: tuple[int, ...] | None = None
    """every act() call's time in step order (bench --hz)"""
    warmed: tuple[bool, ...] | None = None
    """per step, whether the loop runner warmed up before it (bench --hz: every other step)"""
    overruns: int = 0
    """steps whose act() + env.step ended after the next deadline (bench --hz)"""

    def __post_init__(self) -> None:
        integer(self.seed, "seed")
        opt_number(self.ret, "return")
        integer(self.length, "length")
        integer(self.nonfinite_obs, "nonfinite_obs")
        opt_text(self.error, "error", 100_000)
        integer(self.overruns, "overruns", hi=max(self.length, len(self.act_ns or ())))
        if self.warmed is not None and (self.act_ns is None or len(self.warmed) != len(self.act_ns)):
            raise ValueError("warmed must have one flag per timed step (act_ns)")

    @property
    def finished(self) -> bool:
        """Finished with a finite return (a drift pairs only these)."""
        return self.error is None and self.ret is not None

    @classmethod
    def from_dict(cls, v: object, name: str) -> Episode:
        d = obj(v, name)
        ret = d.get("ret")  # JSON has no inf: a return that was not finite arrives as null
        return build(cls, {**d, "ret": ret}, name, {"act_ns": _act_ns, "warmed": _warmed})


def _replay(v: object, name: str) -> tuple[Any, ...] | None:
    """Actions on the trace's states: per state an action (a number or a list of numbers), or null where
    the state was not finite."""
    if v is None:
        return None
    actions = items(v, name, MAX_STEPS_TIMED)
    for a in actions:
        for x in a if isinstance(a, list) else [a]:
            if x is not None and not (isinstance(x, int | float) and not isinstance(x, bool)):
                raise ValueError(f"{name} holds {str(x)[:40]!r}, not an action")
    return actions


@dataclass(frozen=True)
class DeviceRun:
    """One model's run on the device: the runner's ``measured`` event (everything but the episodes) or its
    result, and once merged (PartialBench.finish) the whole run, the episodes of a resumed bench included."""

    model: str
    format: str
    precision: str
    runtime: str
    threads: int
    size_bytes: int
    load_ms: float
    first_inference_ms: float
    latency: Latency | None = None
    episodes: tuple[Episode, ...] = ()
    replay_actions: tuple[Any, ...] | None = None
    replay_nonfinite_obs: int = 0
    peak_rss_mb: float = 0.0
    torch_imported: bool = False
    in_loop: InLoopStats | None = None
    """the runner's own in-loop block (the report's is made again from every episode's act_ns)"""
    sustained: SustainedStats | None = None
    env_on_host: LinkTiming | None = field(default=None, metadata=OMIT_NONE)
    """`bench --env-on-host`: the link's timing, measured here"""

    def __post_init__(self) -> None:
        for k in ("model", "format", "precision", "runtime"):
            text(getattr(self, k), k, NAME_MAX)
        integer(self.threads, "threads", lo=1)
        integer(self.size_bytes, "size_bytes")
        for k in ("load_ms", "first_inference_ms", "peak_rss_mb"):
            number(getattr(self, k), k, lo=0)
        integer(self.replay_nonfinite_obs, "replay_nonfinite_obs")
        flag(self.torch_imported, "torch_imported")

    @classmethod
    def from_dict(cls, v: object, name: str) -> DeviceRun:
        return build(cls, v, name, {
            "latency": optional(lambda x, n: build(Latency, x, n)),
            "episodes": lambda x, n: tuple_of(Episode.from_dict)([] if x is None else x, n),
            "replay_actions": _replay,
            "in_loop": optional(in_loop_from_dict),
            "sustained": optional(sustained_from_dict),
            "env_on_host": optional(LinkTiming.from_dict),
        })  # fmt: skip
