"""What a bench is asked to do (`quarl-edge bench`'s options): each default defined here once (the runner's
own in runtimes/defaults.py), every value checked when the config is made, before anything runs. Light
on purpose: the CLI imports it for its help text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quarl_edge.common import limits
from quarl_edge.runtimes import defaults

MAX_LATENCY_SAMPLES = 10_000_000  # ~10 s of a 1 us model; more is a typo, not a measurement


@dataclass(frozen=True)
class BenchConfig:
    episodes: int = 20
    """closed-loop episodes per model, on seeds seed .. seed+episodes-1 (the same for every model)"""
    seed: int = 1000
    """the first episode seed"""
    threads: int = defaults.THREADS
    latency_samples: int = defaults.LATENCY_SAMPLES
    warmup: int = defaults.WARMUP
    max_steps: int | None = None
    models: tuple[str, ...] | None = None
    """bench only these models (the fp32 reference is always added)"""
    trace: Path | None = None
    """replay trace for action agreement; default: the bundle's own trace.npz"""
    oversubscribe: bool = False
    """let --threads exceed the device's cores (the runner refuses that otherwise)"""
    env_on_host: bool = False
    """closed-loop episodes with the env on this machine and only the policy on the device, one step at a
    time over the link (for an env the board cannot install); the report splits policy from link time"""
    hz: float | None = None
    """control rate: time act() inside the episodes against a 1/hz budget (runtimes.loop)"""
    duration_s: float | None = None
    """a sustained loop per model, with the board's temperature, clock and throttling (runtimes.sustained)"""

    def __post_init__(self) -> None:
        # imported here: runtimes.inloop and .sustained load numpy (~0.25 s), and the CLI reads this module
        # at start-up for its help text
        from quarl_edge.runtimes.inloop import check_hz
        from quarl_edge.runtimes.sustained import check_duration

        check_hz(self.hz)
        check_duration(self.duration_s)
        limits.count(self.episodes, "--episodes", 0, limits.MAX_EPISODES, "20")  # 0: latency only
        limits.check_threads(self.threads)
        limits.check_seed(self.seed)
        limits.count(self.latency_samples, "--latency-samples", 0, MAX_LATENCY_SAMPLES, "1000")
        limits.count(self.warmup, "--warmup", 0, MAX_LATENCY_SAMPLES, "50")

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.episodes))
