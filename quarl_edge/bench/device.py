"""A named device as a bench sees it: the report's device before the device adds its own facts (its
transport: bench/transport.py transport_for), the partial file's kind. The bench itself, on one device or many, is
bench/fleet.py.
"""

from __future__ import annotations

from pathlib import Path

from quarl_edge.bench.partial import PARTIAL_FORMAT
from quarl_edge.bench.result import Device
from quarl_edge.bench.run import BenchConfig
from quarl_edge.devices.profiles import DeviceProfile
from quarl_edge.outputs import Kind, json_format
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.manifest import load_manifest

PARTIAL = Kind("partial bench file", False, lambda p: json_format(p) == PARTIAL_FORMAT)


def device_stub(profile: DeviceProfile) -> Device:
    """The report's ``device`` before the device adds its own facts (bench.run.bench merges them in)."""
    return Device(name=profile.name, emulated=profile.emulated, transport=profile.transport)


def model_count(bundle: Path, cfg: BenchConfig) -> int:
    """How many models the bench will run (for a progress bar): --models and the fp32 reference."""
    manifest = load_manifest(bundle, verify=False)  # bench() verifies the hashes
    ref = manifest.reference()
    return len(set(cfg.models) | {ref.name} if cfg.models and ref else manifest.models)


def unwritable(e: QuarlError | OSError, what: str, kept: str, out: Path) -> InputError:
    """The one line for a finished bench whose report could not be written (its results are kept)."""
    why = e.problem if isinstance(e, QuarlError) else f"{e.strerror or e}"
    return InputError(
        f"{what} could not be written ({why}); {kept}",
        f"free --out {str(out)!r} (or fix its folder) and run the same command with --resume: it "
        "writes the report without measuring again",
    )
