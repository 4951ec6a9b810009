"""``load_policy``: one model of a bundle, checked, opened and warmed up for a control loop (runtimes.policy's
``Policy``, or runtimes.logged's ``LoggedPolicy`` when a field log is asked for).

Its own module, above both: the logging policy subclasses ``Policy``, so the function that picks one of the
two cannot live beside ``Policy`` without an import circle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from .errors import InputError
from .inputs import OnNonfinite, OnOutOfRange
from .logged import LoggedPolicy
from .manifest import load_manifest, verify_model
from .onnx import OrtOptions
from .policy import WARMUP_CALLS, Policy
from .selection import check_device, choose_model, resolve_threads
from .telemetry import LOG_EVERY, LOG_MAX_BYTES


def load_policy(
    bundle: str | Path,
    model: str | None = None,
    threads: int | Literal["tune"] = "tune",
    *,
    warmup: int = WARMUP_CALLS,
    oversubscribe: bool = False,
    on_nonfinite: OnNonfinite = "raise",
    on_out_of_range: OnOutOfRange = "count",
    session_options: OrtOptions | Mapping[str, Any] | None = None,
    device: str | None = None,
    require_signature: bool = False,
    log_dir: str | os.PathLike[str] | None = None,
    log_every: int = LOG_EVERY,
    log_max_bytes: int = LOG_MAX_BYTES,
) -> Policy:
    """Load one model of a bundle for a control loop: its sha256 checked against the manifest, opened
    with ``threads`` threads, and warmed up with ``warmup`` inferences on a zero observation.

    ``model``: a model name of the bundle; default: the model `quarl-edge tune` chose when the bundle
    is tune's, else the bundle's only model besides the fp32 reference (a bundle with several needs
    ``model=``). ``threads``: ``"tune"`` (the count tune recorded for its choice; 1 otherwise) or a count
    up to this device's cores (``oversubscribe=True`` to go past). ``on_nonfinite``: ``"raise"`` (an
    InputError for NaN/inf) or ``"hold"`` (repeat the last action). ``on_out_of_range``: ``"count"``,
    ``"clip"`` (to the calibration range) or ``"fp32"`` (the bundle's fp32 model answers). ``session_options``:
    ONNX Runtime's (``OrtOptions`` or a dict of its fields). ``device``: the device's name (default
    $QUARL_EDGE_DEVICE), to warn when the bundle was tuned on another. ``require_signature``: refuse a
    bundle not signed by a key this machine trusts (a machine with trusted keys requires that anyway).
    ``log_dir``: field telemetry, every ``log_every``-th act() recorded in chunks there, the oldest removed
    past ``log_max_bytes`` (runtimes.telemetry; ``policy.close()`` writes the last chunk, as exit does).
    Errors are ``QuarlError``s whose ``str()`` is one line: the problem and the fix (docs/runtime.md).
    """
    if not isinstance(bundle, str | os.PathLike):
        raise InputError(
            f"bundle must be a folder path (got {type(bundle).__name__})",
            "e.g. load_policy('bundles/cartpole-ppo')",
        )
    bundle = Path(bundle)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise InputError(
            f"warmup must be an integer >= 0 (got {str(warmup)[:24]!r})", f"e.g. warmup={WARMUP_CALLS}"
        )
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
        raise InputError(
            f"log_every must be an integer >= 1 (got {str(log_every)[:24]!r})", "e.g. log_every=1"
        )
    options = OrtOptions.of(session_options)
    manifest = load_manifest(bundle, verify=False, require_signature=require_signature)
    entry, why = choose_model(manifest, model, bundle)
    count, threads_from = resolve_threads(threads, manifest, entry, oversubscribe)
    here = check_device(manifest, device)
    verify_model(bundle, entry)
    kind = Policy if log_dir is None else LoggedPolicy
    policy = kind(bundle, manifest, entry, count, chosen_by=why, on_nonfinite=on_nonfinite,
                  on_out_of_range=on_out_of_range, session_options=options, threads_from=threads_from,
                  device=here)  # fmt: skip
    if isinstance(policy, LoggedPolicy):
        policy.start_log(log_dir, log_every, log_max_bytes)
    policy.warm_up(warmup)
    return policy
