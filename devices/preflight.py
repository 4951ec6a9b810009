"""Pre-flight: before a bench measures anything on a board, check the board can run the bundle there
(a runtime for each model's format, gymnasium and the env's packages for closed-loop episodes, disk for
the upload) and stop at once with the one `quarl-edge devices setup` command that fixes it.

Why: without it, a Pong bench on rpi4-emu spent 1.5 minutes on latency, then failed in the first episode
with the host's advice (`pip install 'quarl-edge[atari]'`), which is wrong for the board.
"""

from __future__ import annotations

import importlib.util
import shlex
from collections.abc import Sequence
from pathlib import Path

from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import MissingDependencyError
from quarl_edge.runtimes.manifest import Manifest, ModelEntry, load_manifest
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.runtimes.spec import EnvConfig

# pip packages that provide each importable env module on a board (cv2: gymnasium's AtariPreprocessing)
ENV_PACKAGES: dict[str, tuple[str, ...]] = {
    "ale_py": ("ale-py",), "cv2": ("opencv-python-headless",), "mujoco": ("mujoco",), "Box2D": ("box2d",),
    "dm_control": ("dm-control", "mujoco"), "shimmy": ("shimmy",),
    "gymnasium_robotics": ("gymnasium-robotics",), "minigrid": ("minigrid",), "gymnasium": ("gymnasium",),
    "imageio": ("imageio",),
}  # fmt: skip
# gymnasium's own Box2D and MuJoCo envs import their engine lazily (the manifest's env.imports is empty)
# (gymnasium's MuJoCo envs import imageio for rendering even when they do not render)
FAMILY_MODULES = {
    "box2d": ("Box2D",),
    "mujoco": ("mujoco", "imageio"),
    "atari": ("ale_py",),
    "dmc": ("shimmy", "dm_control"),
}
# (module, machine) pairs with no wheel on PyPI for that architecture (pip would build from source, which
# fails on a board without SWIG and a compiler): the env runs on the host instead
NO_WHEEL = {("Box2D", "aarch64"), ("Box2D", "armv7l")}
FORMAT_RUNTIMES = {"onnx": ("onnxruntime",), "tflite": ("ai_edge_litert", "tflite_runtime", "tensorflow"),
                   "c": ("numpy",)}  # fmt: skip
UPLOAD_MARGIN = 2.0  # free disk wanted, as a multiple of the upload (temp copy + final)


def env_modules(env: EnvConfig) -> list[str]:
    """The modules a closed-loop episode of this env imports on the device, in order."""
    mods = ["gymnasium", *FAMILY_MODULES.get(env.family, ()), *env.imports]
    if any(w.name == "atari_preprocessing" for w in env.wrappers):
        mods.append("cv2")
    return list(dict.fromkeys(mods))


def packages_for(modules: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(p for m in modules for p in ENV_PACKAGES.get(m, (m,))))


def bundle_packages(bundle: Path) -> list[str]:
    """The pip packages a bundle's closed-loop episodes need on a board beyond the runtime set
    (`devices setup --bundle`)."""
    env = load_manifest(bundle, verify=False).policy.env
    return [p for p in packages_for(env_modules(env)) if p != "gymnasium"]


def setup_command(device: str, packages: Sequence[str]) -> str:
    return " ".join(
        ["quarl-edge devices setup", shlex.quote(device), *(f"--package {shlex.quote(p)}" for p in packages)]
    )


def check_ready(manifest: Manifest, facts: JSONObject, device: str, models: Sequence[str], episodes: int,
                upload_bytes: int = 0) -> None:  # fmt: skip
    """Raise one line naming what the device lacks for this bench, and the command that adds it."""
    runtimes = facts.get("runtimes") or {}
    for name in models:
        fmt = manifest.model(name).format
        if not any(runtimes.get(r) for r in FORMAT_RUNTIMES.get(fmt, ())):
            raise MissingDependencyError(
                f"{device} has no runtime for {fmt} (model {name!r}); nothing was measured",
                f"install it there: {setup_command(device, [])}",
            )
    check_c(manifest, facts, device, models)
    if episodes > 0:
        check_env(manifest.policy.env, facts, device)
    free = facts.get("disk_free_bytes")
    if isinstance(free, int) and upload_bytes and free < UPLOAD_MARGIN * upload_bytes:
        raise MissingDependencyError(
            f"{device} has {free / 2**20:.0f} MiB free, the upload needs about {UPLOAD_MARGIN * upload_bytes / 2**20:.0f} MiB",
            "free space on the device (its cache_dir) or set cache_dir in the device profile to a larger disk",
        )


def check_c(manifest: Manifest, facts: JSONObject, device: str, models: Sequence[str]) -> None:
    """A C model runs where a C compiler builds it (or an object built for the board's machine ships in
    the bundle): raise naming what to install otherwise."""
    if "c_compiler" not in facts or facts.get("c_compiler"):  # a runner too old to say, or a compiler
        return
    machine = str(facts.get("machine") or "")
    for name in models:
        entry = manifest.model(name)
        if entry.format == "c" and not prebuilt_for(entry, machine):
            raise MissingDependencyError(
                f"{device} has no C compiler to build model {name!r} and the bundle has no object built for "
                f"{machine or 'its machine'}; nothing was measured",
                f"install one there ({setup_command(device, ['ziglang'])}, or apt-get install gcc on the board), "
                f"or export with --c-prebuilt {machine or 'ARCH'} to cross-compile it on this host",
            )


def prebuilt_for(entry: ModelEntry, machine: str) -> bool:
    """Whether a model's manifest entry names a prebuilt shared object for ``machine``."""
    return any(f.role == "shared-object" and f.machine == machine for f in entry.files)


def check_env(env: EnvConfig, facts: JSONObject, device: str) -> None:
    """Raise when the device lacks a package the env's closed-loop episodes import."""
    modules = facts.get("modules")
    if not isinstance(modules, dict):  # a runner too old to say: the episode itself will
        return
    have = {**modules, "gymnasium": bool((facts.get("runtimes") or {}).get("gymnasium"))}
    # only what the runner probed (ENV_MODULES, cv2): a user's own module is the episode's to import
    missing = [m for m in env_modules(env) if m in have and not have[m]]
    machine = str(facts.get("machine") or "")
    stuck = [m for m in missing if (m, machine) in NO_WHEEL]
    if stuck:
        raise MissingDependencyError(
            f"{env.id!r} needs {', '.join(packages_for(stuck))} on {device}, which has no wheel for {machine}; "
            "nothing was measured",
            "run the env on the host and only the policy on the board: add --env-on-host",
        )
    if missing:
        raise MissingDependencyError(
            f"{env.id!r} needs {', '.join(missing)} on {device} for closed-loop episodes; nothing was measured",
            f"install it there: {setup_command(device, packages_for(missing))}",
        )


# what installs a runtime on this machine (the host), per model format
HOST_RUNTIME_INSTALL = {"onnx": "pip install onnxruntime", "tflite": "pip install 'quarl-edge[tflite]'",
                        "c": "pip install numpy"}  # fmt: skip


def check_host_ready(manifest: Manifest, models: Sequence[str], episodes: int, device: str = "local") -> None:
    """The pre-flight of the device that is this machine (a fleet's ``local``): a runtime importable here
    for each model's format and, for closed-loop episodes, the env made once, so a missing package stops
    a fleet before any board measures (with the host's install command, not a board's)."""
    for name in models:
        fmt = manifest.model(name).format
        if not any(importlib.util.find_spec(r) for r in FORMAT_RUNTIMES.get(fmt, ())):
            raise MissingDependencyError(
                f"{device} has no runtime for {fmt} (model {name!r}); nothing was measured",
                f"install it here: {HOST_RUNTIME_INSTALL.get(fmt, 'see docs/usage.md')}",
            )
        if fmt == "c":
            from quarl_edge.runtimes.ccompiler import INSTALL, find_compiler

            if find_compiler() is None:
                raise MissingDependencyError(
                    f"{device} has no C compiler to build model {name!r}; nothing was measured", INSTALL
                )
    if episodes > 0:
        make_env(manifest.policy.env).close()
