"""What a tune is asked to do (`quarl-edge tune`'s options), each default defined here once and every
limit checked here, before the policy is loaded or anything is written: a NaN, an infinity or a value
out of range is one InputError (exit 2). Light on purpose (no torch, no Ray): the CLI refuses a bad
flag in a fraction of a second."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quarl_edge.common import limits
from quarl_edge.devices.profiles import ProfileOverrides
from quarl_edge.parallel import Workers
from quarl_edge.runtimes.errors import InputError

KINDS = ("fp32", "fp16", "int8-default", "int8-options", "int8-layers")
"""candidate families (--kinds): int8-default is every calibration method with the exporters' default
split, int8-options the runtime options, int8-layers the per-layer search's splits"""
MIN_BUDGET_S = 20.0  # below this not even the fp32 latency and one closed-loop batch fit
MAX_BUDGET_MIN = 7 * 24 * 60.0  # a week: a larger budget is a typo, not a plan
MAX_SAMPLES = 10_000_000


@dataclass(frozen=True)
class TuneConfig:
    policy: Path
    out: Path
    device: str = "local"
    overrides: ProfileOverrides = ProfileOverrides()
    """device profile overrides (host, user, port, identity)"""
    max_reward_drop_pct: float = limits.MAX_REWARD_DROP_PCT
    """the gate's limit (common/limits.py), which the chosen model must pass"""
    min_agreement: float | None = None
    """also the per-layer search's proxy when set; else 0.95 (discrete) / 0.98 (continuous)"""
    max_p99_ms: float | None = None
    max_action_error: float | None = None
    """where the policy's environment cannot run here, the verdict: the largest action error against fp32
    on the recorded observations (gate's measure: max |Δa| in action units; for discrete actions the share
    of differing actions); required then, refused otherwise (the closed loop judges by reward)"""
    budget_min: float = 15.0
    calibration: Path | None = None
    episodes: int = 20
    """paired closed-loop episodes per candidate"""
    confirm_episodes: int = 40
    """fresh paired episodes that re-check a close call"""
    seed: int = 1000
    latency_samples: int = 500
    max_threads: int | None = None
    env: str | None = None
    algo: str | None = None
    vecnormalize: Path | None = None
    io: Path | None = None
    """the I/O description (io.yaml) of a policy from another framework (an ONNX graph, an rsl_rl
    checkpoint: policy/iodesc.py); part of the policy's content key"""
    kinds: tuple[str, ...] | None = None
    """candidate families to search (KINDS); None: all. The fp32 reference is always measured"""
    workers: int = 1
    """probes and local closed loops side by side (quarl_edge/parallel.py); 1: in this process"""
    ray: bool | None = None
    """None: Ray for more than one worker when it is installed; False: local processes (--no-ray)"""
    address: str | None = None
    """a Ray cluster for the host-side probes (they carry their inputs: no shared files needed)"""
    sign_key: Path | None = None
    """an ed25519 private key: the candidates bundle and the shipped bundle get a manifest.sig, so a board
    that accepts only signed bundles (devices trust-key) can measure and run them"""

    def __post_init__(self) -> None:
        limits.number(self.budget_min, "--budget-min", 0, MAX_BUDGET_MIN, "10", lo_open=True)
        if self.budget_min * 60 < MIN_BUDGET_S:
            raise InputError(f"--budget-min {self.budget_min:g} is too small to measure anything",
                             f"give at least {MIN_BUDGET_S / 60:.1f} minutes, e.g. --budget-min 10")  # fmt: skip
        limits.check_max_reward_drop(self.max_reward_drop_pct)
        if self.min_agreement is not None:
            limits.check_min_agreement(self.min_agreement)
        if self.max_p99_ms is not None:
            limits.check_max_p99_ms(self.max_p99_ms)
        if self.max_action_error is not None:
            limits.check_max_action_error(self.max_action_error)
        limits.check_paired_episodes(self.episodes)
        limits.count(self.confirm_episodes, "confirm_episodes", 0, limits.MAX_EPISODES, "40")
        limits.check_seed(self.seed, "seed")
        limits.count(self.latency_samples, "latency_samples", 1, MAX_SAMPLES, "500")
        if self.max_threads is not None:
            limits.check_threads(self.max_threads, "--max-threads")
        self.parallel  # noqa: B018 (--workers / --no-ray / --address checked here, before any work)
        unknown = [k for k in self.kinds or () if k not in KINDS]
        if unknown:
            raise InputError(f"unknown candidate kind {unknown[0]!r}", f"--kinds takes: {', '.join(KINDS)}")

    @property
    def parallel(self) -> Workers:
        return Workers(self.workers, self.ray, self.address)

    def proxy(self, discrete: bool) -> float:
        """The agreement the per-layer search aims for."""
        if self.min_agreement is not None:
            return self.min_agreement
        return 0.95 if discrete else 0.98
