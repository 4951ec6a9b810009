"""One entry point for "a policy": the importer registry (policy/importers.py) picks the importer for a
path (a quarl-edge checkpoint, an SB3 / sb3-contrib / RL Zoo zip or folder, an rsl_rl checkpoint) and
each yields the same Policy."""

from __future__ import annotations

from pathlib import Path

from quarl_edge.policy.importers import LoadOptions, detect
from quarl_edge.policy.net import Policy


def load_policy(
    path: str | Path,
    env_id: str | None = None,
    algo: str | None = None,
    vecnormalize: str | Path | None = None,
    *,
    io: str | Path | None = None,
    calibration: str | Path | None = None,
) -> Policy:
    """``calibration``: a recorded trace whose metadata names the env, for a policy that does not."""
    path = Path(path)
    opts = LoadOptions(
        env_id=env_id,
        algo=algo,
        vecnormalize=Path(vecnormalize) if vecnormalize else None,
        io=Path(io) if io else None,
        env_hint=env_of_trace(Path(calibration)) if calibration else None,
        env_hint_from="calibration file metadata",
    )
    return detect(path).load(path, opts)


def env_of_trace(path: Path) -> str | None:
    """The env id a trace file records (None when the file is missing or unreadable: whatever uses it
    later reports that in its own words)."""
    from quarl_edge.runtimes.errors import QuarlError
    from quarl_edge.runtimes.trace import load_trace

    if not path.is_file():
        return None
    try:
        env = load_trace(path).meta.get("env_id")
    except QuarlError:
        return None
    return env if isinstance(env, str) and env else None
