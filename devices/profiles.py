"""Device profiles: named TOML files in devices/profiles/ (the SSH transport and board profiles come next)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from quarl_edge.runtimes.errors import InputError

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    transport: str
    description: str = ""
    default_threads: int = 1
    preferred_runtime: str = "onnxruntime"


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name: str) -> DeviceProfile:
    path = PROFILE_DIR / f"{name}.toml"
    if not path.is_file():
        raise InputError(f"unknown device {name!r}", f"known devices: {', '.join(available())}")
    try:
        data = tomllib.loads(path.read_text())
        return DeviceProfile(**{k: v for k, v in data.items() if k in DeviceProfile.__dataclass_fields__})
    except (tomllib.TOMLDecodeError, TypeError) as e:
        raise InputError(f"device profile {str(path)!r} is malformed ({e})", "fix the TOML file") from None


def transport_for(profile: DeviceProfile):  # type: ignore[no-untyped-def]
    """The function that runs the device runner for this profile."""
    if profile.transport == "local":
        from quarl_edge.bench import local_transport

        return local_transport
    raise InputError(
        f"device {profile.name!r} needs the {profile.transport!r} transport", "it is not available yet"
    )
