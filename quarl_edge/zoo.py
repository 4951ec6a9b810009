"""The policy zoo: trained fp32 policies shipped in quarl_edge/assets/policies/, indexed by zoo.json.

Each entry names its environment, algorithm, model, the exact train command, steps, seed and the fp32
return (mean ± std over at least 20 deterministic episodes), plus its calibration rollouts.

A user's own zoo is a folder with the same layout: DIR/zoo.json, DIR/<name>/ (checkpoints) and
DIR/calibration/<name>.npz; `quarl-edge zoo add --zoo DIR` creates it, `study ptq --zoo DIR` runs on it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject

# Package data, where a wheel installs it (importlib.resources; an editable install maps the same names).
POLICIES = Path(str(files("quarl_edge").joinpath("assets", "policies")))
INDEX = POLICIES / "zoo.json"
CALIBRATION = Path(str(files("quarl_edge.calibration_data")))


@dataclass(frozen=True)
class ZooEntry:
    name: str
    env: str
    algo: str
    model: str
    steps: int
    seed: int
    train_command: str
    fp32_return_mean: float
    fp32_return_std: float
    fp32_episodes: int
    suites: tuple[str, ...] = ("paper",)
    root: Path = field(default=POLICIES, compare=False, repr=False)
    """the folder that holds this entry's checkpoint folder (the zoo's own folder)"""
    calibration_root: Path = field(default=CALIBRATION, compare=False, repr=False)

    @property
    def path(self) -> Path:
        return self.root / self.name

    @property
    def present(self) -> bool:
        """whether this entry's checkpoint is on disk"""
        return (self.path / "policy.json").is_file()

    @property
    def calibration(self) -> Path:
        return self.calibration_root / f"{self.name}.npz"

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        del d["root"], d["calibration_root"]
        d["suites"] = list(self.suites)
        return d


@dataclass(frozen=True)
class ZooDir:
    """Where a zoo's index, checkpoints and calibration rollouts live."""

    index: Path
    calibration: Path

    @classmethod
    def of(cls, zoo: Path | None) -> ZooDir:
        """The built-in zoo for None, else the user zoo in folder ``zoo``."""
        if zoo is None:
            return cls(INDEX, CALIBRATION)
        return cls(zoo / "zoo.json", zoo / "calibration")

    @property
    def builtin(self) -> bool:
        return self.index == INDEX


def load_zoo(zoo: Path | None = None) -> list[ZooEntry]:
    return _read_zoo(zoo)[1]


def _read_zoo(zoo: Path | None) -> tuple[dict[str, Any], list[ZooEntry]]:
    """The zoo index as read (to rewrite it) and its entries."""
    where = ZooDir.of(zoo)
    index = where.index
    if not index.is_file():
        if where.builtin:
            raise InputError(
                f"zoo index {str(index)!r} is missing", "reinstall quarl-edge or restore the file from git"
            )
        raise InputError(
            f"no zoo at {str(zoo)!r} (no zoo.json)", "create one with `quarl-edge zoo add --zoo DIR ...`"
        )
    try:
        data = json.loads(index.read_text())
        return data, [
            ZooEntry(
                **{**e, "suites": tuple(e.get("suites", ["paper"]))},
                root=index.parent,
                calibration_root=where.calibration,
            )
            for e in data["policies"]
        ]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        fix = (
            "restore it from git"
            if where.builtin
            else "fix or delete it, then `quarl-edge zoo add --zoo DIR ...`"
        )
        raise InputError(f"zoo index {str(index)!r} is malformed ({e})", fix) from None


def suite(name: str, zoo: Path | None = None) -> list[ZooEntry]:
    if name not in ("quick", "paper"):
        raise InputError(f"unknown suite {name!r}", "choose quick or paper")
    return [e for e in load_zoo(zoo) if name in e.suites]


def train_command(env: str, algo: str, steps: int, seed: int, name: str, train: dict[str, Any]) -> str:
    """The `quarl-edge train` command that reproduces a run, from its recorded train info."""
    cmd = f"quarl-edge train --env {env} --algo {algo} --steps {steps} --seed {seed} --eval-episodes 20"
    if train.get("checkpoint_every"):
        cmd += f" --checkpoint-every {train['checkpoint_every']}"
    if train.get("keep_best"):
        cmd += f" --keep-best {train['keep_best']}"
    if qat := train.get("qat"):
        cmd += f" --qat-bits {qat['bits']} --quant-delay {qat['delay']}"
        if qat.get("scope", "all") != "all":
            cmd += f" --qat-scope {qat['scope']}"
    return cmd + f" --out {name}"


def add(
    policy_dir: Path,
    name: str,
    suites: tuple[str, ...] = ("paper",),
    episodes: int = 20,
    max_samples: int | None = None,
    zoo: Path | None = None,
    progress: Any = None,
    env_id: str | None = None,
    algo: str | None = None,
    vecnormalize: Path | None = None,
) -> ZooEntry:
    """Put a finished `quarl-edge train` checkpoint, or an SB3 / RL Zoo .zip (``env_id``, ``algo`` and
    ``vecnormalize`` as for `quarl-edge export`), into a zoo (the built-in one, or the folder ``zoo``,
    created if new): evaluate the fp32 return over ``episodes`` deterministic episodes, record its
    calibration rollouts, copy the checkpoint next to zoo.json and index it there (an entry of the same
    name is replaced)."""
    import dataclasses
    import re

    from quarl_edge.outputs import CHECKPOINT, TRACE, claim
    from quarl_edge.policy.load import load_policy
    from quarl_edge.policy.net import save_checkpoint
    from quarl_edge.record import RecordConfig, record
    from quarl_edge.runtimes.fsutil import atomic_write_json
    from quarl_edge.runtimes.trace import save_trace
    from quarl_edge.train.trainer import evaluate

    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        raise InputError(f"zoo name {name!r} is not a plain lowercase name", "e.g. --name halfcheetah-td3")
    if zoo is not None and name == "calibration":
        raise InputError(
            "the zoo name 'calibration' is taken by the zoo's calibration folder", "pick another --name"
        )
    for s in suites:
        if s not in ("quick", "paper"):
            raise InputError(f"unknown suite {s!r}", "choose quick and/or paper")
    if episodes < 20:
        raise InputError(f"--episodes {episodes} is too few for a zoo entry", "use at least 20")
    policy = load_policy(policy_dir, env_id=env_id, algo=algo, vecnormalize=vecnormalize)
    policy.spec = dataclasses.replace(policy.spec, name=name)
    train = policy.spec.train
    imported = train.get("imported_from")
    if not imported and (train.get("partial") or "steps" not in train):
        raise InputError(
            f"{str(policy_dir)!r} is not a finished `quarl-edge train` run",
            "finish it (`quarl-edge train ... --resume`) and add the final checkpoint",
        )
    where = ZooDir.of(zoo)
    if zoo is not None and zoo.exists() and not zoo.is_dir():
        raise InputError(
            f"--zoo {str(zoo)!r} is a file, not a folder", "name a folder (it is created if new)"
        )
    # read (and validate) the index before the long evaluation; a new user zoo starts empty
    data, entries = (
        _read_zoo(zoo)
        if where.index.exists() or where.builtin
        else ({"format": "quarl-edge/zoo", "version": 1}, [])
    )
    # the entry's two files: absent or ours, and neither the policy being added (checked before the evaluation)
    checkpoint, calibration = where.index.parent / name, where.calibration / f"{name}.npz"
    reads = [("policy", policy_dir), ("VecNormalize file", vecnormalize)]
    claim(checkpoint, CHECKPOINT, reads, "--name", f"the zoo entry {str(checkpoint)!r}")
    claim(calibration, TRACE, reads, "--name", f"the zoo entry's calibration file {str(calibration)!r}")
    say = progress or (lambda _m: None)
    say(f"evaluating {name} over {episodes} episodes")
    mean, std, _ = evaluate(policy, episodes)
    say(f"{name}: fp32 return {mean:.1f} ± {std:.1f}; recording calibration rollouts")
    image = len(policy.spec.observation_space.shape) == 3
    samples = max_samples or (1000 if image else 5000)  # Atari frames: ~1000 keeps the file well under 10 MB
    trace = record(policy, RecordConfig(episodes=10, epsilon=0.1, seed=0, max_samples=samples))
    seed = int(train.get("seed", 0))
    if imported:  # an SB3 / RL Zoo .zip: trained elsewhere, so there is no command of ours to record
        steps = int(train.get("num_timesteps") or 0)
        command = f"imported from {imported} (Stable-Baselines3 .zip, trained outside quarl-edge)"
    else:
        steps = int(train.get("selected_step", train["steps"]))
        requested = int(train.get("requested_steps") or train["steps"])
        command = train_command(policy.spec.env.id, policy.spec.algo, requested, seed, name, train)
    entry = ZooEntry(
        name=name, env=policy.spec.env.id, algo=policy.spec.algo, model=policy.spec.model, steps=steps,
        seed=seed, train_command=command, fp32_return_mean=round(mean, 2), fp32_return_std=round(std, 2),
        fp32_episodes=episodes, suites=tuple(suites),
    )  # fmt: skip
    where.calibration.mkdir(parents=True, exist_ok=True)
    save_checkpoint(policy, checkpoint)  # atomic: the folder appears complete or not at all
    save_trace(trace, calibration)
    data["policies"] = [e.to_dict() for e in entries if e.name != name] + [entry.to_dict()]
    atomic_write_json(where.index, data)  # last: the entry names files that are already in place
    return dataclasses.replace(entry, root=where.index.parent, calibration_root=where.calibration)
