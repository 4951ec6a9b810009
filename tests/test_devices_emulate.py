"""The emulated Raspberry Pi 4 and offline device setup, without a board: mirror parsing, the Pi 4
cpuinfo, the device entry, link and wheelhouse validation, pinning for the device's platform (real pip
against a local wheel folder), the setup commands run for real in a shell with hostile paths, and the
CLI's one-line errors. The board itself (`quarl-edge devices emulate rpi4 up`, benches on aarch64, `down`)
is in tests/test_devices_emulate_e2e.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quarl_edge.devices import emulate, netns, profiles, rootfs, wheelhouse
from quarl_edge.devices.setup import OpenSSH, venv_of
from quarl_edge.runtimes.errors import InputError, MissingDependencyError

HOSTILE = "we ird'$(touch PWNED);`id`\"x"


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


# ---- mirror from the host's apt configuration ----------------------------------------------------

ONE_LINE = """\
# a comment
deb-src http://src.example.org/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example.org/debian/ bookworm main contrib
deb http://security.example.org/debian-security bookworm-security main
"""

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://off.example.org/debian
Suites: bookworm
Enabled: no

Types: deb deb-src
URIs: https://a.example.org/debian
 https://b.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.example.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_one_line_sources() -> None:
    sources = rootfs.parse_one_line(ONE_LINE)
    assert [s.types for s in sources] == [("deb-src",), ("deb",), ("deb",)]
    assert sources[1].options["arch"] == "amd64"
    assert rootfs.pick_mirror(sources) == "http://mirror.example.org/debian"


def test_mirror_from_deb822_sources() -> None:
    sources = rootfs.parse_deb822(DEB822)
    assert [s.uri for s in sources] == [
        "https://a.example.org/debian",
        "https://b.example.org/debian",
        "http://deb.example.org/debian-security",
    ]
    assert sources[0].suites == ("bookworm", "bookworm-updates")
    assert rootfs.pick_mirror(sources) == "https://a.example.org/debian"


def test_mirror_falls_back_to_a_debian_archive_then_asks(tmp_path: Path) -> None:
    trixie = rootfs.parse_one_line("deb http://m.example.org/debian trixie main\n")
    assert rootfs.pick_mirror(trixie, "bookworm") == "http://m.example.org/debian"
    ubuntu = rootfs.parse_one_line("deb http://archive.ubuntu.com/ubuntu noble main\n")
    with pytest.raises(InputError, match="--mirror"):
        rootfs.pick_mirror(ubuntu, "bookworm")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.sources").write_text(DEB822)
    (tmp_path / "d" / "y.list").write_text(ONE_LINE)
    found = rootfs.host_sources(tmp_path / "missing.list", tmp_path / "d")
    assert len(found) == 6


def test_mirror_option_is_checked() -> None:
    assert rootfs.check_mirror("http://deb.example.org/debian/") == "http://deb.example.org/debian"
    for bad in ("deb.example.org/debian", "http://x y", "--foreign"):
        with pytest.raises(InputError):
            rootfs.check_mirror(bad)


@pytest.mark.skipif(not Path("/etc/apt").is_dir(), reason="not a Debian-family host")
def test_this_hosts_mirror_is_found() -> None:
    assert rootfs.host_mirror().startswith(("http", "file", "ftp"))


# ---- the Pi 4 board ---------------------------------------------------------------------------------


def test_pi4_cpuinfo_describes_four_cortex_a72() -> None:
    text = rootfs.pi4_cpuinfo()
    cores = [b for b in text.split("\n\n") if b.startswith("processor")]
    assert len(cores) == 4
    for i, block in enumerate(cores):
        fields = dict((k.strip(), v.strip()) for k, v in (ln.split(":", 1) for ln in block.splitlines()))
        assert fields["processor"] == str(i)
        assert (fields["CPU implementer"], fields["CPU part"], fields["CPU architecture"]) == (
            "0x41",
            "0xd08",
            "8",
        )
    assert "Hardware\t: BCM2711" in text and "Raspberry Pi 4" in text and "emulated" in text


def test_board_registry_and_link() -> None:
    b = emulate.board("rpi4")
    assert (b.device, b.arch, b.link.host_address, b.link.device_address) == (
        "rpi4-emu",
        "aarch64",
        "10.231.4.1",
        "10.231.4.2",
    )
    with pytest.raises(InputError, match="known boards: rpi4"):
        emulate.board("rpi9")
    with pytest.raises(InputError):
        netns.Link("qe-x", "qe-x-h", "qe-x-d", "10.231.9.0/24")
    with pytest.raises(InputError):
        netns.Link("qe;rm", "qe-x-h", "qe-x-d", "10.231.9.0/30")
    with pytest.raises(InputError):
        netns.Link("qe-x", "a-very-long-interface", "qe-x-d", "10.231.9.0/30")


@pytest.mark.parametrize(("rate", "ok"), [("20mbit", True), ("512Kbit", True), ("1.5gbit", True), ("fast", False),
                                           ("20", False), ("0mbit", False), ("20mbit; reboot", False)])  # fmt: skip
def test_rate_is_a_tc_rate(rate: str, ok: bool) -> None:
    if ok:
        assert netns.parse_rate(rate) == rate.lower()
    else:
        with pytest.raises(InputError):
            netns.parse_rate(rate)


def test_sshd_config_is_key_only_and_listens_in_the_namespace() -> None:
    conf = emulate.sshd_config(emulate.board("rpi4"))
    lines = set(conf.splitlines())
    assert {
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "ListenAddress 10.231.4.2",
    } <= lines
    assert "PermitRootLogin prohibit-password" in lines
    assert "SetEnv QEMU_CPU=cortex-a72" in lines  # sessions run on an emulated Cortex-A72, not qemu's `max`
    assert "Subsystem sftp /usr/lib/openssh/sftp-server" in lines


def test_recipe_hash_changes_with_the_recipe() -> None:
    a = rootfs.RootfsRecipe()
    assert a.key() == rootfs.RootfsRecipe().key()
    assert a.key() != rootfs.RootfsRecipe(packages=(*a.packages, "htop")).key()
    assert a.key() != rootfs.RootfsRecipe(revision=a.revision + 1).key()


def test_status_of_a_board_never_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(emulate, "RUN_DIR", tmp_path / "run")
    st = emulate.status("rpi4")
    assert (st.built, st.running, st.pid, st.emulated) == (False, False, None, True)
    assert st.rootfs.startswith(str(tmp_path / "cache" / "quarl-edge" / "emulate" / "rpi4"))


# ---- the device entry and known_hosts --------------------------------------------------------------


def _entry(**kw: object) -> emulate.DeviceEntry:
    base = dict(name="rpi4-emu", host="10.231.4.2", port=22, user="root", identity="/k/id_ed25519",
                known_hosts="/k/known_hosts", python="/opt/quarl-edge/venv/bin/python", arch="aarch64",
                cpu="Cortex-A72 (emulated by qemu-aarch64)", cores=4, extends="rpi4", description="emu")  # fmt: skip
    base.update(kw)
    return emulate.DeviceEntry(**base)  # type: ignore[arg-type]


def test_device_entry_loads_as_an_emulated_rpi4_profile(config_home: Path) -> None:
    path = emulate.write_entry(_entry())
    assert path.parent == config_home / "quarl-edge" / "devices.d"
    p = profiles.load_profile("rpi4-emu")
    assert (p.host, p.port, p.user, p.emulated, p.arch, p.transport) == (
        "10.231.4.2",
        22,
        "root",
        True,
        "aarch64",
        "ssh",
    )
    assert (p.identity, p.known_hosts, p.python) == (
        "/k/id_ed25519",
        "/k/known_hosts",
        "/opt/quarl-edge/venv/bin/python",
    )
    assert (
        p.cores == 4 and p.default_threads == profiles.load_profile("rpi4").default_threads
    )  # from `extends`
    assert "rpi4-emu" in profiles.available()


def test_device_entry_with_shell_metacharacters_round_trips(config_home: Path) -> None:
    weird = f"/tmp/{HOSTILE}\\back\nline/id"
    emulate.write_entry(_entry(identity=weird, description=f"emu {HOSTILE}"))
    p = profiles.load_profile("rpi4-emu")
    assert p.identity == weird and p.description == f"emu {HOSTILE}"
    ssh = OpenSSH(host=p.ssh_host, user=p.user or "", identity=p.identity, known_hosts=f"/k/{HOSTILE}")
    assert f"UserKnownHostsFile=/k/{HOSTILE}" in ssh.options()  # argv element: no shell in between
    with pytest.raises(InputError):
        OpenSSH(host="-oProxyCommand=touch x", user="root").target()


def test_a_hand_written_table_still_wins(config_home: Path) -> None:
    emulate.write_entry(_entry())
    (config_home / "quarl-edge" / "devices.toml").write_text("[rpi4-emu]\nport = 2222\n")
    assert profiles.load_profile("rpi4-emu").port == 2222
    assert (config_home / "quarl-edge" / "devices.toml").read_text() == "[rpi4-emu]\nport = 2222\n"


def test_known_hosts_line_brackets_non_standard_ports() -> None:
    b = emulate.board("rpi4")
    assert emulate._known_host(b) == "10.231.4.2"
    assert emulate._known_host(emulate.EmulatedBoard(**{**b.__dict__, "port": 2222})) == "[10.231.4.2]:2222"


# ---- wheelhouse and setup commands ------------------------------------------------------------------


def test_platform_tags_cover_every_glibc_up_to_the_device() -> None:
    tags = wheelhouse.WheelhouseSpec().platform_tags()
    assert tags[0] == "manylinux_2_36_aarch64" and "manylinux_2_17_aarch64" in tags
    assert "manylinux2014_aarch64" in tags and not any("2_37" in t for t in tags)
    cmd = wheelhouse.download_command(wheelhouse.WheelhouseSpec(), Path("/w h"))
    assert cmd[cmd.index("--python-version") + 1] == "3.11" and cmd[cmd.index("--dest") + 1] == "/w h"
    assert "--only-binary=:all:" in cmd
    assert cmd[-4:] == ["numpy", "onnxruntime", "gymnasium", "ai-edge-litert"]


@pytest.mark.parametrize(
    "bad", [{"python_version": "3"}, {"glibc": "2.x"}, {"arch": "arm 64"}, {"packages": ("--index-url=x",)}]
)
def test_wheelhouse_spec_validation(bad: dict[str, object]) -> None:
    with pytest.raises(InputError):
        wheelhouse.WheelhouseSpec(**bad)  # type: ignore[arg-type]


def test_host_pinned_pins_what_the_host_has() -> None:
    pinned = wheelhouse.host_pinned(("numpy", "no-such-package-qe"))
    assert pinned[0].startswith("numpy==") and pinned[1] == "no-such-package-qe"


def _wheel(folder: Path, name: str, version: str, tag: str) -> Path:
    """A real, installable wheel of module ``name`` for the platform ``tag`` (e.g. manylinux_2_30_aarch64)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-{tag}\n".encode(),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    out = folder / f"{name}-{version}-py3-none-{tag}.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return out


@pytest.fixture
def wheel_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local wheel folder as pip's only index (no network): qe-probe 1.0 (glibc 2.17) and 2.0 (glibc
    2.30) for aarch64; qe-opt only for x86_64. The pins cache in a private folder."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "qe_probe", "1.0", "manylinux_2_17_aarch64")
    _wheel(folder, "qe_probe", "2.0", "manylinux_2_30_aarch64")
    _wheel(folder, "qe_opt", "1.0", "manylinux_2_17_x86_64")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


@pytest.mark.slow
def test_pins_prefer_the_host_version_else_the_newest_with_a_wheel(wheel_index: Path, tmp_path: Path) -> None:
    """The rule the emulated Pi and `devices setup` use, decided by the real pip for the device's tags."""
    host = {"qe-probe": "2.0", "qe-opt": "1.0"}
    new = wheelhouse.WheelhouseSpec(glibc="2.36", packages=("qe-probe", "qe-opt"))
    spec, pins = wheelhouse.platform_pinned(new, optional=frozenset({"qe-opt"}), host_versions=host)
    assert spec.packages == ("qe-probe==2.0",)
    assert [(p.name, p.version, p.host) for p in pins] == [
        ("qe-probe", "2.0", "2.0"),
        ("qe-opt", None, "1.0"),
    ]
    assert pins[0].reason == "host version" and pins[1].reason.startswith("left out: no version has a wheel")

    old = wheelhouse.WheelhouseSpec(glibc="2.24", packages=("qe-probe",))  # a board with an older glibc
    spec, pins = wheelhouse.platform_pinned(old, host_versions=host)
    assert spec.packages == ("qe-probe==1.0",)
    assert pins[0].reason == "the host's 2.0 has no wheel for aarch64 cp311 (glibc 2.24); newest with one"

    # the wheelhouse records what it holds and why
    wheels = wheelhouse.download(spec, tmp_path / "house", pins=pins)
    assert [w.name for w in wheels] == ["qe_probe-1.0-py3-none-manylinux_2_17_aarch64.whl"]
    data = json.loads((tmp_path / "house" / "wheelhouse.json").read_text())
    assert data["versions"] == {"qe-probe": "1.0"} and data["pins"][0]["host"] == "2.0"

    # cached: the answer stands without the index (a cached board starts offline)
    shutil.rmtree(wheel_index)
    assert wheelhouse.platform_pinned(old, host_versions=host)[0] == spec
    with pytest.raises(MissingDependencyError, match="no set of aarch64 wheels"):  # not optional, no wheel
        wheelhouse.platform_pinned(wheelhouse.WheelhouseSpec(packages=("qe-opt",)), host_versions=host)


def test_wheelhouse_folder_is_used_as_given(tmp_path: Path) -> None:
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"")
    assert [w.name for w in wheelhouse.resolve(wheelhouse.WheelhouseSpec(), tmp_path)] == [
        "a-1-py3-none-any.whl"
    ]
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(InputError):
        wheelhouse.resolve(wheelhouse.WheelhouseSpec(), f)


def test_venv_of_profile_python() -> None:
    assert venv_of(".local/share/quarl-edge/venv/bin/python") == ".local/share/quarl-edge/venv"
    assert venv_of("/opt/v/bin/python3") == "/opt/v"
    assert venv_of("python3") == wheelhouse.DEVICE_VENV


def test_setup_commands_refuse_paths_as_wheel_names() -> None:
    for bad in (["../x.whl"], ["x.tar.gz"], []):
        with pytest.raises(InputError):
            wheelhouse.setup_commands("python3", bad)


def _tiny_wheel(folder: Path) -> Path:
    """A real, installable pure-Python wheel (module qe_probe)."""
    name = "qe_probe-0.1-py3-none-any.whl"
    files = {
        "qe_probe/__init__.py": b"VALUE = 42\n",
        "qe_probe-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: qe-probe\nVersion: 0.1\n",
        "qe_probe-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("qe_probe-0.1.dist-info/RECORD,,")
    with zipfile.ZipFile(folder / name, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr("qe_probe-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return folder / name


@pytest.mark.slow
def test_setup_commands_run_in_a_real_shell_with_hostile_paths(tmp_path: Path) -> None:
    """The exact remote commands, run by /bin/sh in a folder whose name is a shell injection attempt."""
    home = tmp_path / HOSTILE
    home.mkdir()
    wheel = _tiny_wheel(tmp_path)
    venv, wheels_dir = f"v {HOSTILE}", f"w {HOSTILE}"
    cmds = wheelhouse.setup_commands(
        sys.executable, [wheel.name], venv=venv, wheel_dir=wheels_dir, packages=("qe-probe",)
    )
    assert shlex.split(cmds[0]) == ["mkdir", "-p", wheels_dir]
    subprocess.run(["/bin/sh", "-c", cmds[0]], cwd=home, check=True)
    shutil.copy(wheel, home / wheels_dir / wheel.name)
    assert shlex.split(cmds[-1]) == ["rm", "-rf", "--", wheels_dir]
    for cmd in cmds[1:]:
        subprocess.run(
            ["/bin/sh", "-c", cmd],
            cwd=home,
            check=True,
            capture_output=True,
            env={**os.environ, "PIP_FIND_LINKS": ""},
        )
    out = subprocess.run([str(home / venv / "bin/python"), "-c", "import qe_probe; print(qe_probe.VALUE)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "42"
    assert not list(tmp_path.rglob("PWNED"))


# ---- CLI ----------------------------------------------------------------------------------------------


QUARL_EDGE = Path(sys.executable).parent / "quarl-edge"  # the installed entry point, as a user runs it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["emulate", "rpi9", "status"], "known boards: rpi4"),
        (["emulate", "rpi4", "up", "--rate", "fast"], "is not a tc rate"),
        (["emulate", "rpi4", "up", "--mirror", "ftp//x"], "is not an http(s)/ftp/file URL"),
        (["setup", "no-such-device"], "unknown device"),
    ],
)
def test_cli_errors_are_one_line_on_stderr_exit_2(config_home: Path, args: list[str], message: str) -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="200")
    r = subprocess.run(
        [str(QUARL_EDGE), "devices", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr


def test_cli_status_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quarl_edge.cli import app  # the real command tree (RUN_DIR is patched, so in process)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(emulate, "RUN_DIR", tmp_path / "run")
    r = CliRunner().invoke(app, ["devices", "emulate", "rpi4", "status", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)  # stdout alone: the data, nothing else
    assert data["emulated"] is True and data["running"] is False and data["device"] == "rpi4-emu"
