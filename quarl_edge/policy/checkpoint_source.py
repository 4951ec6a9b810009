"""The importer of quarl-edge's own checkpoint folders (policy.json + weights.npz, policy/net.py)."""

from __future__ import annotations

from pathlib import Path

from quarl_edge.policy.importers import LoadOptions, Source, register
from quarl_edge.policy.net import Policy, is_checkpoint, load_checkpoint
from quarl_edge.runtimes.errors import InputError


def _load(path: Path, opts: LoadOptions) -> Policy:
    if opts.vecnormalize:
        raise InputError(
            "--vecnormalize applies to SB3 .zip files only", "checkpoints carry their normalization"
        )
    return load_checkpoint(path)


register(
    Source(
        "checkpoint",
        "a folder written by `quarl-edge train`",
        lambda p: p.is_dir() and is_checkpoint(p),
        _load,
    )
)
