"""The ``c`` runtime (issue 31 scope 2): built once per (source, compiler, flags) into our cache folder,
never inside the bundle; no compiler is one line naming what to install; pre-flight says so before a
bench; CPU flags only for the features a CPU has; the hot loops vectorize (gcc -O3 -S on x86-64, the
aarch64 cross compiler where one is installed). Run with ``-s`` for the instruction counts."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.devices.preflight import check_ready
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.ccompiler import BASE_FLAGS, Compiler, cross_compiler, find_compiler
from quarl_edge.runtimes.errors import MissingDependencyError
from quarl_edge.runtimes.manifest import load_manifest


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("QUARL_EDGE_C_CACHE", str(root))
    return root


def test_built_once_into_our_cache_never_into_the_bundle(
    c_bundle: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = c_bundle("cartpole-ppo")  # exported first: export's fp32 parity check builds c-fp32 itself
    cache = tmp_path / "fresh-cache"
    monkeypatch.setenv("QUARL_EDGE_C_CACHE", str(cache))
    before = sorted(p.name for p in bundle.iterdir())
    p = load_policy(bundle, model="c-int8", threads=1)
    objects = list(cache.glob("*/policy.so"))
    assert len(objects) == 1
    stamp = objects[0].stat().st_mtime_ns
    assert p.info.runtime == "c" and p.info.runtime_version.startswith(("gcc-", "clang-", "zig-"))
    load_policy(bundle, model="c-int8", threads=1)  # the cached object, not a second build
    assert [o.stat().st_mtime_ns for o in cache.glob("*/policy.so")] == [stamp]
    load_policy(bundle, model="c-fp32", threads=1)
    assert len(list(cache.glob("*/policy.so"))) == 2
    assert sorted(p.name for p in bundle.iterdir()) == before
    action = p.act(np.array([0.01, -0.2, 0.03, 0.1], np.float32))
    assert isinstance(action, int) and action in (0, 1)


def test_no_compiler_is_one_line_naming_what_to_install(
    c_bundle: Callable[[str], Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUARL_EDGE_CC", "none")
    with pytest.raises(MissingDependencyError) as e:
        load_policy(c_bundle("cartpole-ppo"), model="c-int8", threads=1)
    msg = str(e.value)
    assert "no C compiler" in msg and "apt-get install gcc" in msg and "ziglang" in msg and "\n" not in msg
    monkeypatch.setenv("QUARL_EDGE_CC", "/nonexistent/cc")
    with pytest.raises(MissingDependencyError, match="not a working C compiler"):
        load_policy(c_bundle("cartpole-ppo"), model="c-int8", threads=1)


def test_preflight_stops_a_bench_on_a_board_without_a_compiler(c_bundle: Callable[[str], Path]) -> None:
    manifest = load_manifest(c_bundle("cartpole-ppo"))
    facts = {"runtimes": {"numpy": "2.4", "onnxruntime": "1.32", "gymnasium": "1.4"}, "machine": "aarch64",
             "c_compiler": None}  # fmt: skip
    with pytest.raises(MissingDependencyError) as e:
        check_ready(manifest, facts, "pi", ["c-int8"], episodes=0)
    msg = str(e.value)
    assert "no C compiler" in msg and "--package ziglang" in msg and "--c-prebuilt aarch64" in msg
    check_ready(manifest, {**facts, "c_compiler": "gcc-12.2.0"}, "pi", ["c-int8"], episodes=0)
    check_ready(manifest, facts, "pi", ["onnx-int8"], episodes=0)  # other formats are not its concern


def test_cpu_flags_follow_the_cpu_features() -> None:
    gcc, zig = Compiler(("gcc",), "gcc", "12"), Compiler(("zig", "cc"), "zig", "0.17")
    pi4 = {"asimd": True, "asimddp": False, "i8mm": False}
    pi5 = {"asimd": True, "asimddp": True, "i8mm": False}
    assert gcc.flags("aarch64", pi4) == ("-march=armv8-a",)
    assert gcc.flags("aarch64", pi5) == ("-march=armv8.2-a+dotprod",)
    assert zig.flags("aarch64", pi5) == ("-mcpu=generic+dotprod",)
    assert gcc.flags("x86_64", {"avx2": True, "avx512f": True, "avx512_vnni": True}) == (
        "-march=x86-64-v4", "-mavx512vnni")  # fmt: skip
    assert gcc.flags("x86_64", {"avx2": True}) == ("-march=x86-64-v3",)
    assert gcc.flags("x86_64", None) == () and gcc.flags("riscv64", {}) == ()


def _asm(
    compiler: list[str], flags: tuple[str, ...], c_file: Path, tmp: Path
) -> dict[str, collections.Counter[str]]:
    """Instruction counts per function of ``c_file`` compiled with ``flags``."""
    out = tmp / "policy.s"
    shutil.copy(c_file.with_suffix(".h"), tmp / c_file.with_suffix(".h").name)
    subprocess.run([*compiler, *BASE_FLAGS[:3], *flags, "-S", "-o", str(out), str(c_file), f"-I{c_file.parent}"],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    fn = ""
    for line in out.read_text().splitlines():
        m = re.match(r"^([A-Za-z_]\w*):", line)
        if m:
            fn = m.group(1)
        elif line.startswith("\t") and not line.startswith("\t."):
            counts[fn][line.split()[0]] += 1
    return counts


def _all(counts: dict[str, collections.Counter[str]]) -> collections.Counter[str]:
    total: collections.Counter[str] = collections.Counter()
    for c in counts.values():
        total.update(c)
    return total


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_hot_loops_vectorize_on_x86_64(c_bundle: Callable[[str], Path], tmp_path: Path) -> None:
    """Pendulum SAC c-int8 (a 256x256 int8 layer between float layers): pmaddwd for the int8 dot product
    on baseline x86-64 and AVX2, vpdpbusd with AVX-512 VNNI; packed float multiplies for the float layers."""
    c_file = c_bundle("pendulum-sac") / "policy.int8.c"
    seen = {}
    for flags, want in ((("-march=x86-64",), "pmaddwd"), (("-march=x86-64-v3",), "vpmaddwd"),
                        (("-march=x86-64-v4", "-mavx512vnni"), "vpdpbusd")):  # fmt: skip
        total = _all(_asm(["gcc"], flags, c_file, tmp_path))
        seen[flags] = {
            k: v
            for k, v in total.items()
            if "madd" in k or "dpbusd" in k or k.startswith(("mulps", "vfmadd", "vmulps"))
        }
        assert total[want] > 0, (flags, seen[flags])
        assert (
            total["mulps"] + total["vmulps"] + sum(v for k, v in total.items() if k.startswith("vfmadd")) > 0
        )
    print("\n" + "\n".join(f"{' '.join(f)}: {s}" for f, s in seen.items()))


def test_the_hot_loops_vectorize_on_aarch64(c_bundle: Callable[[str], Path], tmp_path: Path) -> None:
    """The same file for aarch64 with the host's cross compiler (ziglang or gcc-aarch64-linux-gnu): sdot
    with +dotprod (Pi 5), smull/smlal widening multiplies without (Pi 4); fmla for the float layers."""
    try:
        cc = cross_compiler("aarch64")
    except MissingDependencyError as e:
        pytest.skip(f"no aarch64 cross compiler here ({e})")
    c_file = c_bundle("pendulum-sac") / "policy.int8.c"
    pi4 = _all(_asm(list(cc.command), cc.flags("aarch64", {"asimddp": False}), c_file, tmp_path))
    pi5 = _all(_asm(list(cc.command), cc.flags("aarch64", {"asimddp": True}), c_file, tmp_path))
    print(f"\n{cc.name}: Pi 4 flags smull {pi4['smull']} smull2 {pi4['smull2']} smlal {pi4['smlal']} "
          f"fmla {pi4['fmla']}; Pi 5 flags sdot {pi5['sdot']}")  # fmt: skip
    assert pi5["sdot"] > 0 and pi4["sdot"] == 0
    assert pi4["smull"] + pi4["smull2"] + pi4["smlal"] + pi4["smlal2"] > 0
    assert pi4["fmla"] + pi4["fmul"] > 0


def test_find_compiler_here() -> None:
    c = find_compiler()
    assert c is not None and c.kind in ("gcc", "clang", "zig")


@pytest.fixture(scope="module")
def prebuilt_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CartPole c-int8 with a shared object cross-compiled for this machine's architecture (zig or the
    Debian cross gcc), as a board without a compiler would get it."""
    import platform

    from conftest import CALIB, POLICIES

    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.exporters.base import ExportConfig
    from quarl_edge.policy.net import load_checkpoint

    machine = platform.machine()
    try:
        cross_compiler(machine)
    except MissingDependencyError as e:
        pytest.skip(f"no cross compiler for {machine} here ({e})")
    out = tmp_path_factory.mktemp("prebuilt") / "cartpole"
    req = BundleRequest(out=out, targets=("onnx-int8", "c-int8"), calibration=CALIB / "cartpole-ppo.npz",
                        config=ExportConfig(c_prebuilt=(machine,)))  # fmt: skip
    export_bundle(load_checkpoint(POLICIES / "cartpole-ppo"), req)
    return out


def test_manifest_records_the_header_and_the_prebuilt_object(prebuilt_bundle: Path) -> None:
    import platform

    entry = load_manifest(prebuilt_bundle).model("c-int8")
    roles = {f.role: f for f in entry.files}
    assert roles["header"].file == "policy.int8.h"
    so = roles["shared-object"]
    assert so.file == f"policy.int8.{platform.machine()}.so" and so.machine == platform.machine()
    assert so.built_by and so.size_bytes == (prebuilt_bundle / so.file).stat().st_size


def test_prebuilt_object_runs_only_when_trusted(
    prebuilt_bundle: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No compiler here: the bundle's object for this machine, loaded only from a bundle signed by a
    trusted key (or by the user's explicit QUARL_EDGE_C_PREBUILT=trust); the same actions as compiled."""
    from quarl_edge.runtimes.errors import IntegrityError
    from quarl_edge.runtimes.trace import load_trace

    obs = load_trace(prebuilt_bundle / "trace.npz").obs
    compiled = load_policy(prebuilt_bundle, model="c-int8", threads=1).act_batch(obs)
    monkeypatch.setenv("QUARL_EDGE_CC", "none")
    with pytest.raises(IntegrityError) as e:
        load_policy(prebuilt_bundle, model="c-int8", threads=1)
    assert "prebuilt shared object" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("QUARL_EDGE_C_PREBUILT", "trust")
    p = load_policy(prebuilt_bundle, model="c-int8", threads=1)
    assert p.info.runtime_version.startswith("prebuilt:")
    assert np.array_equal(p.act_batch(obs), compiled)
    assert list(cache.glob("prebuilt-*/policy.so"))


def test_a_tampered_header_fails_the_bundle_check(c_bundle: Callable[[str], Path], tmp_path: Path) -> None:
    from quarl_edge.runtimes.errors import IntegrityError

    bundle = tmp_path / "b"
    shutil.copytree(c_bundle("cartpole-ppo"), bundle)
    h = bundle / "policy.int8.h"
    h.write_text(h.read_text().replace("QE_POLICY_OBS_SIZE 4", "QE_POLICY_OBS_SIZE 5"))
    with pytest.raises(IntegrityError, match="policy.int8.h"):
        load_policy(bundle, model="c-int8", threads=1)
