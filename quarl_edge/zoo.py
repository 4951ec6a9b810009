"""The policy zoo: trained fp32 policies shipped in quarl_edge/assets/policies/, indexed by zoo.json.

Each entry names its environment, algorithm, model, the exact train command, steps, seed and the fp32
return (mean ± std over at least 20 deterministic episodes), plus its calibration rollouts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quarl_edge.runtimes.errors import InputError

POLICIES = Path(__file__).resolve().parent / "assets" / "policies"
INDEX = POLICIES / "zoo.json"
CALIBRATION = Path(__file__).resolve().parent.parent / "calibration_data"


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

    @property
    def path(self) -> Path:
        return POLICIES / self.name

    @property
    def calibration(self) -> Path:
        return CALIBRATION / f"{self.name}.npz"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["suites"] = list(self.suites)
        return d


def load_zoo(index: Path = INDEX) -> list[ZooEntry]:
    if not index.is_file():
        raise InputError(
            f"zoo index {str(index)!r} is missing", "reinstall quarl-edge or restore the file from git"
        )
    try:
        data = json.loads(index.read_text())
        return [ZooEntry(**{**e, "suites": tuple(e.get("suites", ["paper"]))}) for e in data["policies"]]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise InputError(f"zoo index {str(index)!r} is malformed ({e})", "restore it from git") from None


def suite(name: str, index: Path = INDEX) -> list[ZooEntry]:
    entries = load_zoo(index)
    if name not in ("quick", "paper"):
        raise InputError(f"unknown suite {name!r}", "choose quick or paper")
    return [e for e in entries if name in e.suites]
