"""Pre-flight (devices/preflight.py): what a bench needs on a board, from the bundle's manifest and the
facts the board's runner reports, and the one line that names the fix. The emulated board's end-to-end
case (a Pong bundle stopped before anything is uploaded) is in tests/test_devices_emulate.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from quarl_edge.devices.preflight import bundle_packages, check_env, check_ready, env_modules, packages_for
from quarl_edge.policy.registry import env_config
from quarl_edge.runtimes.__main__ import device_info
from quarl_edge.runtimes.errors import MissingDependencyError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.spec import EnvConfig

BOARD = {"machine": "aarch64", "runtimes": {"numpy": "2.4", "onnxruntime": "1.32", "gymnasium": "1.4"},
         "modules": {"ale_py": False, "cv2": False, "Box2D": False, "mujoco": True, "imageio": True, "shimmy": False,
                     "dm_control": False}, "disk_free_bytes": 10 * 2**30}  # fmt: skip


def test_the_modules_each_env_family_needs() -> None:
    assert env_modules(env_config("ALE/Pong-v5")) == ["gymnasium", "ale_py", "cv2"]
    assert env_modules(env_config("LunarLander-v3")) == ["gymnasium", "Box2D"]
    assert env_modules(env_config("HalfCheetah-v5")) == ["gymnasium", "mujoco", "imageio"]
    assert env_modules(env_config("CartPole-v1")) == ["gymnasium"]
    assert packages_for(["ale_py", "cv2"]) == ["ale-py", "opencv-python-headless"]


def test_a_missing_env_package_names_the_setup_command() -> None:
    with pytest.raises(MissingDependencyError) as e:
        check_env(env_config("ALE/Pong-v5"), BOARD, "pi")
    assert "quarl-edge devices setup pi --package ale-py --package opencv-python-headless" in str(e.value)
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    check_env(env_config("HalfCheetah-v5"), BOARD, "pi")  # mujoco is there
    ready = {**BOARD, "modules": {**BOARD["modules"], "ale_py": True, "cv2": True}}  # type: ignore[dict-item]
    check_env(env_config("ALE/Pong-v5"), ready, "pi")


def test_a_package_without_a_wheel_for_the_board_says_so() -> None:
    with pytest.raises(MissingDependencyError, match="needs box2d on pi, which has no wheel for aarch64"):
        check_env(env_config("LunarLander-v3"), BOARD, "pi")
    on_x86 = {**BOARD, "machine": "x86_64"}
    with pytest.raises(MissingDependencyError, match="--package box2d"):
        check_env(env_config("LunarLander-v3"), on_x86, "pc")


def test_what_the_runner_did_not_probe_is_left_to_the_episode() -> None:
    custom = EnvConfig(id="my_pkg.envs:Thing-v0")
    check_env(custom, BOARD, "pi")  # the user's own module: the runner imports it in the episode
    check_env(env_config("ALE/Pong-v5"), {"runtimes": {}}, "pi")  # an older runner reports no modules


def test_runtimes_and_disk(cartpole_bundle: Path) -> None:
    manifest = load_manifest(cartpole_bundle)
    names = [m.name for m in manifest.models]
    check_ready(manifest, BOARD, "pi", names, episodes=3, upload_bytes=10**6)
    no_ort = {**BOARD, "runtimes": {"numpy": "2.4", "gymnasium": "1.4", "onnxruntime": None}}
    with pytest.raises(MissingDependencyError, match="pi has no runtime for onnx .*devices setup pi"):
        check_ready(manifest, no_ort, "pi", names, episodes=0)
    full = {**BOARD, "disk_free_bytes": 10**6}
    with pytest.raises(MissingDependencyError, match="MiB free"):
        check_ready(manifest, full, "pi", names, episodes=0, upload_bytes=10**6)
    no_gym = {**BOARD, "runtimes": {**BOARD["runtimes"], "gymnasium": None}}  # type: ignore[dict-item]
    check_ready(manifest, no_gym, "pi", names, episodes=0)  # latency only: no env needed
    with pytest.raises(MissingDependencyError, match="--package gymnasium"):
        check_ready(manifest, no_gym, "pi", names, episodes=1)
    assert bundle_packages(cartpole_bundle) == []


def test_the_runner_reports_env_modules_and_free_disk_here() -> None:
    info = device_info()
    assert set(info["modules"]) >= {"ale_py", "mujoco", "Box2D", "cv2"}
    assert (
        info["modules"]["ale_py"] is True and info["disk_free_bytes"] > 0
    )  # the test venv has the atari extra
