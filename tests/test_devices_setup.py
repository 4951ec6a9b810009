"""`devices setup` from the board's own facts, the offline wheelhouse route, and `~` as the board's $HOME
(issue 29, scope 2).

The SSH tests use a board (a real sshd on loopback) whose sessions start in a login directory other than
its $HOME (tests/conftest.py ``away_board``): everything of ours must land under $HOME and nothing in
the login directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SSHD, Board, assert_one_error

from quarl_edge.devices import wheelhouse
from quarl_edge.devices.board_platform import BoardPlatform, chosen, parse_probe
from quarl_edge.devices.profiles import parse_home, remote_path
from quarl_edge.runtimes.errors import InputError, MissingDependencyError, QuarlError

needs_sshd = pytest.mark.skipif(
    not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"
)
HOST_GLIBC = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]  # e.g. 2.36: the loopback board is this machine
HOST_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


# ---- the rules, without a board ---------------------------------------------------------------------


def test_a_tilde_or_relative_remote_path_is_under_the_boards_home() -> None:
    home = "/srv/pi home"
    assert remote_path("~", home) == home
    assert remote_path("~/", home) == home
    assert remote_path("~/.cache/quarl-edge", home) == f"{home}/.cache/quarl-edge"
    assert remote_path(".local/share/x/bin/python", home) == f"{home}/.local/share/x/bin/python"
    assert remote_path("./venv", home) == f"{home}/venv"
    assert remote_path("/opt/venv/bin/python", home) == "/opt/venv/bin/python"
    with pytest.raises(InputError, match=r"only ~/ \(the board's \$HOME\)"):
        remote_path("~pi/venv", home)
    assert parse_home("/home/pi/", 0, "b") == "/home/pi"
    for bad, status in (("", 0), ("relative", 0), ("/x\x1b[31m", 0), ("/home/pi", 1)):
        with pytest.raises(QuarlError, match="did not tell its home folder"):
            parse_home(bad, status, "b")


def _probe(**fields: Any) -> str:
    data = {"home": "/home/pi", "machine": "aarch64", "bits": 64, "python": "3.11", "libc": ["glibc", "2.36"]}
    return json.dumps({**data, **fields})


def test_the_board_platform_is_parsed_and_checked_field_by_field() -> None:
    assert parse_probe(_probe(), 0, "b") == BoardPlatform("aarch64", "3.11", "2.36", "/home/pi")
    # a 32-bit Raspberry Pi OS on a 64-bit kernel: uname says aarch64, its Python loads armv7l wheels
    assert parse_probe(_probe(bits=32), 0, "b").arch == "armv7l"
    musl = parse_probe(_probe(libc=["", ""]), 0, "b")
    assert musl.glibc is None
    with pytest.raises(InputError, match="does not run glibc"):
        chosen(musl, None, None, None, "b")
    assert chosen(musl, None, None, "2.31", "b").glibc == "2.31"  # the flag overrides the fact
    assert chosen(parse_probe(_probe(), 0, "b"), "armv7l", None, None, "b").arch == "armv7l"
    for bad, match in (
        (_probe(machine="x86_64; rm -rf /"), "reports the machine"),
        (_probe(python="2.7"), "not Python 3"),
        (_probe(home="relative"), "did not tell its home"),
        ("no json here", "printed no platform facts"),
    ):
        with pytest.raises(QuarlError, match=match):
            parse_probe(bad, 0, "b")
    with pytest.raises(QuarlError, match="has no working python3"):
        parse_probe("", 127, "b")


def _spec(arch: str = "x86_64", py: str = "3.11", glibc: str = "2.36") -> wheelhouse.WheelhouseSpec:
    return wheelhouse.WheelhouseSpec(arch=arch, python_version=py, glibc=glibc)


@pytest.mark.parametrize(
    ("wheel", "fits"),
    [
        ("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", True),
        ("numpy-2.4.6-cp311-cp311-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl", False),
        ("numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.whl", False),
        ("onnxruntime-1.32.0-cp311-cp311-manylinux_2_38_x86_64.whl", False),  # newer glibc than the board's
        ("cryptography-50.0.2-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", True),
        ("cryptography-50.0.2-cp37-abi3-manylinux2014_x86_64.whl", True),
        ("protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl", True),
        ("gymnasium-1.4.0-py3-none-any.whl", True),
        ("flatbuffers-25.12.19-py2.py3-none-any.whl", True),
        ("thing-1.0-cp311-cp311-macosx_14_0_arm64.whl", False),
        ("thing-1.0-cp311-cp311-linux_x86_64.whl", True),  # built on such a board
        ("thing-1.0-cp311-cp311-manylinux_2_17_x86_64_v2.whl", False),
    ],
)
def test_a_wheel_fits_the_board_by_its_tags(wheel: str, fits: bool) -> None:
    assert (wheelhouse.wheel_fits(wheel, _spec()) is None) is fits


def test_a_carried_wheelhouse_gives_what_fits_and_names_what_is_missing(tmp_path: Path) -> None:
    names = ["numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", "numpy-2.4.6-cp311-cp311-manylinux_2_28_aarch64.whl",
             "gymnasium-1.4.0-py3-none-any.whl"]  # fmt: skip
    wheels = [tmp_path / n for n in names]
    fit = wheelhouse.for_platform(wheels, _spec(), ("numpy", "gymnasium"), "fix")
    assert [w.name for w in fit] == [names[0], names[2]]  # one folder may serve several boards
    with pytest.raises(InputError) as e:
        wheelhouse.for_platform(wheels, _spec("armv7l"), ("numpy",), "rebuild it")
    assert str(e.value) == (
        "the wheelhouse has no numpy wheel for armv7l Python 3.11 (numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl "
        "is for manylinux_2_28_x86_64, the board is armv7l with glibc 2.36); rebuild it"
    )
    two = [*wheels, tmp_path / "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    with pytest.raises(InputError, match="holds numpy 2.4.6 and 2.3.0"):
        wheelhouse.for_platform(two, _spec(), ("numpy",), "fix")


def test_devices_wheelhouse_refuses_a_folder_it_did_not_make(tmp_path: Path, cli: Any) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    r = cli(
        "devices", "wheelhouse", folder, "--arch", "aarch64", "--python-version", "3.11", "--glibc", "2.36"
    )
    assert "is not a wheelhouse of ours" in assert_one_error(r)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    r = cli(
        "devices",
        "wheelhouse",
        tmp_path / "new",
        "--arch",
        "aarch64",
        "--python-version",
        "three",
        "--glibc",
        "2.36",
    )
    assert "python version 'three' is not like 3.11" in assert_one_error(r)


# ---- against a board whose login directory is not its $HOME -----------------------------------------


@pytest.fixture
def away(
    away_board: tuple[Board, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Board, Path]:
    """Host side as conftest's ``on_board``; the device ``board`` names its paths with ``~``."""
    board, login = away_board
    monkeypatch.setenv("HOME", str(tmp_path / "host-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "host-cache"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "host-home").mkdir()
    board.device(tmp_path / "xdg" / "quarl-edge", tmp_path / "known_hosts", python="~/venv/bin/python",
                 cache_dir="~/.cache/quarl-edge", arch="aarch64")  # fmt: skip
    return board, login


@pytest.mark.ssh
@needs_sshd
def test_tilde_is_the_boards_home_for_bench_and_deploy_not_the_login_directory(
    away: tuple[Board, Path], cartpole_bundle: Path
) -> None:
    from quarl_edge.bench.fleet import bench_on_device
    from quarl_edge.bench.run import BenchConfig
    from quarl_edge.deploy import DEPLOYED, deploy
    from quarl_edge.runtimes.fsutil import sha256_file

    board, login = away
    cfg = BenchConfig(episodes=1, max_steps=50, latency_samples=10, warmup=1, models=("onnx-int8",))
    report = bench_on_device(cartpole_bundle, cfg, device="board")
    assert report.models[-1].name == "onnx-int8"
    sha = sha256_file(cartpole_bundle / "manifest.json")
    cache = board.home / ".cache" / "quarl-edge"
    assert (cache / "bundles" / sha / "manifest.json").is_file() and list((cache / "runner").glob("*.pyz"))
    d = deploy(cartpole_bundle, "board", "onnx-int8", name="away")
    assert d.path == str(board.home / DEPLOYED / "away") and (board.home / DEPLOYED / "away").is_symlink()
    assert d.python == str(board.python)  # absolute: the line printed for the board runs from any folder
    assert list(login.iterdir()) == [], "something of ours landed in the login directory"


@pytest.mark.ssh
@needs_sshd
def test_setup_reads_the_board_and_refuses_a_wheelhouse_for_another_board(
    away: tuple[Board, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quarl_edge.devices.setup import setup_device

    board, login = away
    carried = tmp_path / "carried"
    carried.mkdir()
    for name in ("numpy-2.4.6-cp311-cp311-manylinux_2_28_aarch64.whl", "gymnasium-1.4.0-py3-none-any.whl"):
        (carried / name).write_bytes(b"never read: refused by its name")
    before = board.snapshot()
    lines: list[str] = []
    with pytest.raises(InputError) as e:
        setup_device("board", carried, log=lines.append)
    # the facts are the board's (the profile says aarch64): x86_64, its python3, its glibc
    assert lines[0] == f"board: x86_64, Python {_board_python()}, glibc {HOST_GLIBC} (read from the board)"
    assert lines[1] == "board: its profile says arch = 'aarch64'; the wheels are for what it is, x86_64"
    msg = str(e.value)
    assert (
        msg.startswith("the wheelhouse has no numpy wheel for x86_64 Python")
        and "is for manylinux_2_28_aarch64" in msg
    )
    assert (
        f"quarl-edge devices wheelhouse DIR --arch x86_64 --python-version {_board_python()} --glibc {HOST_GLIBC}"
        in msg
    )
    assert board.snapshot() == before and list(login.iterdir()) == []  # refused before anything went up

    # no wheelhouse and no index (a host without internet): the error is the offline route, filled in
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-index"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(MissingDependencyError) as e:
        setup_device("board", log=lines.append)
    assert str(e.value).endswith(
        f"on a host with internet run `quarl-edge devices wheelhouse DIR --arch x86_64 --python-version "
        f"{_board_python()} --glibc {HOST_GLIBC}`, carry DIR here, then `quarl-edge devices setup board --wheelhouse DIR`"
    )
    assert board.snapshot() == before and list(login.iterdir()) == []


def _board_python() -> str:
    """The loopback board's python3 (the sshd session's PATH), as `devices setup` finds it."""
    r = subprocess.run(["/bin/sh", "-c", "PATH=/usr/local/bin:/usr/bin:/bin; python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'"],
                       capture_output=True, text=True, check=True)  # fmt: skip
    return r.stdout.strip()


@pytest.mark.ssh
@pytest.mark.slow
@needs_sshd
def test_offline_wheelhouse_route_builds_the_venv_under_home(
    away: tuple[Board, Path], tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/devices.md's offline route, as printed: `devices wheelhouse` on a host with internet (here:
    the package index), the folder carried, then `devices setup --wheelhouse` on a host without any
    index; the venv lands at the profile's ``~/.local/...`` under the board's $HOME and its runtimes
    import; the login directory stays empty."""
    from quarl_edge.devices.check import check_device
    from quarl_edge.devices.profiles import load_profile
    from quarl_edge.devices.setup import setup_device

    board, login = away
    py = _board_python()
    made = tmp_path / "wheelhouse"
    r = cli("devices", "wheelhouse", made, "--arch", "x86_64", "--python-version", py, "--glibc", HOST_GLIBC,
            timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"quarl-edge devices setup NAME --wheelhouse {made}" in r.stderr
    carried = Path(shutil.copytree(made, tmp_path / "usb-stick" / "wh"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the offline host: pip has nowhere to download from
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-index"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    venv_python = "~/.local/share/quarl-edge/venv/bin/python"
    with (tmp_path / "xdg" / "quarl-edge" / "devices.toml").open("a") as f:
        f.write(f'\n["board2"]\nextends = "board"\narch = "x86_64"\npython = "{venv_python}"\n')
    result = setup_device("board2", carried, log=print)
    assert result.python == str(board.home / ".local/share/quarl-edge/venv/bin/python")
    assert result.platform is not None and result.platform.arch == "x86_64"
    assert {"numpy", "onnxruntime", "gymnasium"} <= set(result.versions())
    assert not (board.home / ".cache/quarl-edge/wheels").exists()  # installed: the wheels are gone
    check = check_device(load_profile("board2"))
    assert not check.problems, check.problems
    assert check.facts["runtimes"]["onnxruntime"]
    assert list(login.iterdir()) == []
