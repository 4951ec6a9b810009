"""What ``load_policy`` picks before it opens anything: the model, its thread count, the fp32 model that
answers out-of-range observations, and whether the bundle was tuned on another device."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from .adapters import MAX_THREADS
from .errors import InputError, IntegrityError
from .manifest import Manifest, ModelEntry

DEVICE_ENV = "QUARL_EDGE_DEVICE"
"""names the device a policy is loaded on (a profile name, e.g. ``rpi4``), for the tuned-elsewhere warning"""


class DeviceMismatchWarning(UserWarning):
    """A bundle tuned on one device is loaded on another: tune's choice and thread count were measured there."""


def available_cores() -> int:
    """The cores this process may run on (its affinity: a container or ``taskset`` can allow fewer than
    the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose_model(manifest: Manifest, model: str | None, bundle: Path) -> tuple[ModelEntry, str]:
    """The model to load and why: ``model`` when given, else tune's choice, else the only model that is
    not the fp32 reference. Several candidates and no choice: an InputError listing them."""
    if model is not None:
        return manifest.model(model), "argument"
    names = [m.name for m in manifest.models]
    # a tune choice that names no model here is a damaged bundle, never a fallback
    if manifest.tune is not None:
        chosen = manifest.tune.chosen
        if chosen not in names:
            raise IntegrityError(
                f"bundle {str(bundle)!r}: its tune choice {str(chosen)[:80]!r} is not one of its models "
                f"({', '.join(names)})",
                "run `quarl-edge tune` again, or load a model by name (model=...)",
                cli_fix="run `quarl-edge tune` again, or name a model with --model NAME",
            )
        return manifest.model(chosen), "tune"
    if len(manifest.models) == 1:
        return manifest.models[0], "only model"
    ref = manifest.reference()
    others = [m for m in manifest.models if m is not ref]
    if len(others) == 1:
        return others[0], "only model besides the fp32 reference"
    if not names:
        raise InputError(f"bundle {str(bundle)!r} has no models", "re-export it with `quarl-edge export`")
    raise InputError(
        f"bundle {str(bundle)!r} has {len(names)} models and no tune choice: {', '.join(names)}",
        f"pick one, e.g. load_policy({str(bundle)!r}, model={names[-1]!r})",
        cli_fix=f"pick one, e.g. --model {names[-1]}",
    )


def resolve_threads(
    threads: Any, manifest: Manifest, entry: ModelEntry, oversubscribe: bool
) -> tuple[int, str]:
    """The thread count to open ``entry`` with, and where it came from (``argument``, ``tune``,
    ``default``). ``"tune"``: the count `quarl-edge tune` recorded for the model it chose (validated where
    read), capped to this device's cores with a warning; any other model, or a bundle not tune's: 1."""
    cores = available_cores()
    if not isinstance(oversubscribe, bool):
        raise InputError(
            f"oversubscribe must be True or False (got {str(oversubscribe)[:24]})", "e.g. oversubscribe=True"
        )
    if threads == "tune":
        if manifest.tune is None or manifest.tune.chosen != entry.name:
            return 1, "default"
        count = manifest.tune.threads  # from 1 to MAX_THREADS: checked when the manifest was read
        if count > cores and not oversubscribe:
            warnings.warn(f"the bundle was tuned at {count} threads; this device has {cores} cores: loading "
                          f"with threads={cores} (pass oversubscribe=True for {count})", stacklevel=3)  # fmt: skip
            return cores, "tune, capped to the cores"
        return count, "tune"
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise InputError(
            f"threads must be an integer or 'tune' (got {str(threads)[:24]!r})", "e.g. threads=1"
        )
    if threads < 1:
        raise InputError(f"threads must be at least 1 (got {threads})", "e.g. threads=1")
    if threads > MAX_THREADS:
        raise InputError(f"threads={str(threads)[:24]} is above {MAX_THREADS}, the most a policy is opened with",
                         f"use threads={cores} (this device's cores) or fewer")  # fmt: skip
    if threads > cores and not oversubscribe:  # more threads than cores only measures contention
        raise InputError(f"threads={threads} is more than the {cores} cores of this device",
                         f"use threads={cores} or fewer, or pass oversubscribe=True")  # fmt: skip
    return threads, "argument"


def fp32_model(manifest: Manifest, entry: ModelEntry) -> ModelEntry:
    """The bundle's fp32 model that answers for ``entry`` out of its calibration range: ``entry`` itself
    when it is fp32, else the fp32 model of its format, else the bundle's fp32 reference."""
    if entry.precision == "fp32":
        return entry
    fp32 = [m for m in manifest.models if m.precision == "fp32"]
    same = [m for m in fp32 if m.format == entry.format]
    if same or fp32:
        return (same or fp32)[0]
    raise InputError(
        "on_out_of_range='fp32' needs the bundle's fp32 model, and this bundle has none",
        "re-export it with an fp32 model beside this one (e.g. --to onnx-fp32,onnx-int8), "
        "or use on_out_of_range='clip' or 'count'",
    )


def check_device(manifest: Manifest, device: Any) -> str | None:
    """The device the policy is loaded on (``device=``, else $QUARL_EDGE_DEVICE, else None: unknown), with a
    DeviceMismatchWarning when the bundle was tuned on another. Names are profile names: a board does not
    know its own, so the check runs only where one is given."""
    here, where = (
        (device, "device") if device is not None else (os.environ.get(DEVICE_ENV) or None, f"${DEVICE_ENV}")
    )
    if here is not None and (not isinstance(here, str) or not 0 < len(here) <= 64 or not here.isprintable()):
        raise InputError(f"{where} must be a device name of 1-64 printable characters (got {str(here)[:24]!r})",
                         "e.g. device='rpi4'")  # fmt: skip
    tuned_on = manifest.tune.device if manifest.tune is not None else None
    if here is not None and tuned_on is not None and tuned_on != here:
        warnings.warn(
            f"this bundle was tuned on device {tuned_on[:64]!r} and is loaded on {here[:64]!r}: its model "
            f"choice and thread count were measured there; re-tune with `quarl-edge tune --device {here[:64]}`",
            DeviceMismatchWarning,
            stacklevel=3,
        )
    return here
