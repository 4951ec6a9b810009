"""One entry point for "a policy": a quarl-edge checkpoint folder or an SB3 / RL Zoo .zip."""

from __future__ import annotations

from pathlib import Path

from quarl_edge.policy.net import Policy, is_checkpoint, load_checkpoint
from quarl_edge.runtimes.errors import InputError


def load_policy(
    path: str | Path,
    env_id: str | None = None,
    algo: str | None = None,
    vecnormalize: str | Path | None = None,
) -> Policy:
    path = Path(path)
    if path.is_dir():
        if not is_checkpoint(path):
            raise InputError(
                f"{str(path)!r} is not a quarl-edge policy folder (no policy.json)",
                "train one with `quarl-edge train` or pass an SB3 .zip",
            )
        if vecnormalize:
            raise InputError(
                "--vecnormalize applies to SB3 .zip files only", "checkpoints carry their normalization"
            )
        return load_checkpoint(path)
    if path.suffix == ".zip":
        from quarl_edge.policy.sb3 import load_sb3_zip

        return load_sb3_zip(path, env_id=env_id, algo=algo, vecnormalize=vecnormalize)
    if not path.exists():
        raise InputError(f"policy {str(path)!r} does not exist", "pass a checkpoint folder or an SB3 .zip")
    raise InputError(
        f"{str(path)!r} is neither a quarl-edge checkpoint folder nor an SB3 .zip",
        "pass a folder written by `quarl-edge train` or a .zip saved by SB3",
    )
