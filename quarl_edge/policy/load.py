"""One entry point for "a policy": a quarl-edge checkpoint folder, an SB3 / RL Zoo .zip, or an RL Zoo /
Hugging Face model folder as downloaded (one .zip, its vec_normalize.pkl beside it)."""

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
    if path.is_dir() and not is_checkpoint(path):
        return _load_zoo_folder(path, env_id, algo, vecnormalize)
    if path.is_dir():
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


def _load_zoo_folder(
    path: Path, env_id: str | None, algo: str | None, vecnormalize: str | Path | None
) -> Policy:
    """An RL Zoo / Hugging Face folder: exactly one model .zip, and the VecNormalize statistics saved
    beside it (``vec_normalize.pkl``) unless --vecnormalize names others. The algorithm and env come
    from the zip or its RL Zoo name (``ppo-CartPole-v1.zip``), else from the folder's (``ppo-CartPole-v1``)."""
    from quarl_edge.policy.sb3 import load_sb3_zip, names_from_filename

    zips = sorted(p for p in path.glob("*.zip") if p.is_file())
    if not zips:
        raise InputError(
            f"{str(path)!r} is neither a quarl-edge checkpoint (no policy.json) nor an RL Zoo folder (no .zip)",
            "pass a folder written by `quarl-edge train`, an SB3 .zip, or an RL Zoo model folder",
        )
    if len(zips) > 1:
        raise InputError(
            f"{str(path)!r} holds {len(zips)} model zips ({', '.join(z.name for z in zips[:4])})",
            "pass the one to use: --policy FOLDER/NAME.zip",
        )
    stats = path / "vec_normalize.pkl"
    vn = vecnormalize if vecnormalize else (stats if stats.is_file() else None)
    if env_id is None and names_from_filename(zips[0])[1] is None:
        env_id = names_from_filename(Path(path.name + ".zip"))[1]  # the folder's RL Zoo name
    return load_sb3_zip(zips[0], env_id=env_id, algo=algo, vecnormalize=vn)
