"""The board's facts in every report (runtimes/facts.py): read from this machine's real /proc and
checked against what the test reads itself, the cpuinfo parser on real ARM cpuinfo text (a Pi 4's
Cortex-A72 has no dot product, a Pi 5's Cortex-A76 has), and the facts row of a local bench report."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from quarl_edge.bench.report import write_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.devices.rootfs import pi4_cpuinfo
from quarl_edge.runtimes.facts import (
    ARM_FEATURES,
    X86_FEATURES,
    cpu_model,
    device_info,
    emulation,
    facts_text,
    hwcap_features,
    isa_features,
    parse_cpuinfo,
)

# A Raspberry Pi 5 (BCM2712, Cortex-A76 r4p1), as its arm64 kernel prints one core
PI5_CORE = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1

Revision\t: d04170
Serial\t\t: 5dd4b1b9c1a2b3c4
Model\t\t: Raspberry Pi 5 Model B Rev 1.0
"""
# a Raspberry Pi 3 on a 32-bit kernel: NEON is called neon there
PI3_ARMV7 = "processor\t: 0\nmodel name\t: ARMv7 Processor rev 4 (v7l)\nFeatures\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32\nCPU part\t: 0xd03\n"


def test_arm_cpuinfo_names_the_core_and_its_int8_features() -> None:
    a72 = parse_cpuinfo(pi4_cpuinfo())
    assert cpu_model(a72) == "Cortex-A72"
    assert isa_features(a72, "aarch64") == {"asimd": True, "asimdhp": False, "asimddp": False, "i8mm": False,
                                            "bf16": False}  # fmt: skip
    a76 = parse_cpuinfo(PI5_CORE)
    assert cpu_model(a76) == "Cortex-A76"
    assert isa_features(a76, "aarch64") == {"asimd": True, "asimdhp": True, "asimddp": True, "i8mm": False,
                                            "bf16": False}  # fmt: skip
    v7 = isa_features(parse_cpuinfo(PI3_ARMV7), "armv7l")
    assert v7 is not None and v7["asimd"] and not v7["asimddp"]
    # qemu-user without the board's cpuinfo shows the host's x86 one: it says nothing about the ARM CPU
    host = parse_cpuinfo("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2\n")
    assert isa_features(host, "aarch64") is None and isa_features(host, "x86_64") == {
        f: f == "avx2" for f in X86_FEATURES
    }
    assert isa_features({}, "riscv64") is None and isa_features({}, "aarch64") is None


def test_qemu_user_is_told_by_the_kernels_own_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QEMU_CPU", "cortex-a72")
    assert emulation("aarch64", "x86_64") == {"emulator": "qemu-user", "kernel_arch": "x86_64",
                                              "qemu_cpu": "cortex-a72"}  # fmt: skip
    monkeypatch.delenv("QEMU_CPU")
    assert emulation("aarch64", "x86_64")["qemu_cpu"] is None  # type: ignore[index]
    assert emulation("aarch64", "aarch64") is None and emulation("x86_64", None) is None


def _read_flags() -> set[str]:
    """This machine's CPU flags, read here independently of the module under test."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="needs Linux /proc")
def test_facts_of_this_machine_from_its_real_proc() -> None:
    d = device_info()
    machine = platform.machine()
    assert d["machine"] == machine and d["python"] == platform.python_version()
    flags = _read_flags()
    if machine == "x86_64":
        assert d["cpu_features_source"] == "/proc/cpuinfo" and hwcap_features() is None
        assert d["cpu_features"] == {f: f in flags for f in X86_FEATURES}
        assert d["cpu_features"]["avx2"] is True  # every x86-64 machine this runs on has AVX2
    elif machine == "aarch64":
        assert d["cpu_features_source"] == "hwcap" and set(d["cpu_features"]) == set(ARM_FEATURES)
    meminfo = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:"))
    assert d["mem_total_mb"] == pytest.approx(int(meminfo.split()[1]) / 1024, abs=0.1)
    assert d["os"] == platform.freedesktop_os_release().get("PRETTY_NAME")
    governor = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    assert d["governor"] == (governor.read_text().strip() if governor.is_file() else None)
    assert d["ort_providers"] == onnxruntime.get_available_providers()
    assert d["runtimes"]["onnxruntime"] == onnxruntime.__version__
    assert d["emulation"] is None  # this test runs natively
    assert json.loads(json.dumps(d)) == d


def test_the_runner_reports_them(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "quarl_edge.runtimes", "info"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    for key in (
        "cpu_features",
        "cpu_features_source",
        "governor",
        "mem_total_mb",
        "os",
        "ort_providers",
        "emulation",
    ):
        assert key in info, key
    assert info["cpu_features"] == device_info()["cpu_features"]


def test_a_local_bench_report_carries_the_facts_and_a_markdown_row(
    cartpole_bundle: Path, tmp_path: Path
) -> None:
    report = bench(cartpole_bundle, BenchConfig(episodes=1, latency_samples=20, models=("onnx-int8",)))
    dev = report.to_dict()["device"]
    assert dev["name"] == "local" and dev["machine"] == platform.machine() and dev["cores"] >= 1
    assert dev["cpu_features"] == device_info()["cpu_features"] and dev["os"]
    _, md = write_report(report, tmp_path / "r.json")
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("Device facts: ")]
    assert len(rows) == 1 and "int8 ISA: " in rows[0] and f"onnxruntime {onnxruntime.__version__}" in rows[0]
    if platform.machine() == "x86_64":
        assert "avx2" in rows[0]


def test_facts_from_a_device_are_data() -> None:
    hostile = {"machine": "aarch64\n| x |", "cpu_model": "<b>A72</b>", "cpu_features": ["asimddp"],
               "runtimes": {"onnxruntime": 5}, "mem_total_mb": "lots", "emulation": "yes"}  # fmt: skip
    text = facts_text(hostile)  # wrong types are skipped, not shown as facts or raised on
    assert text.startswith("aarch64\n| x |, <b>A72</b>; int8 ISA: ?") and "GiB" not in text
    from report_json import NORMAL

    from quarl_edge.bench.report import markdown, parse_report

    report = parse_report({**NORMAL, "device": {"name": "d", **hostile}})  # facts are data: read as they are
    row = next(ln for ln in markdown(report).splitlines() if ln.startswith("Device facts: "))
    assert "\\n" in row and "\\|" in row and "&lt;b&gt;" in row and "<b>" not in row
