"""The first hour of a new user (issue 29): every error speaks the interface it came from, deploy says when
a bundle was tuned on another board, names are safe in shells, and our commands print no third-party
noise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import SSHD, Board, assert_one_error

from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import InputError

# ---- errors in the interface's own words ------------------------------------------------------------


def test_a_bundle_with_several_models_asks_for_a_flag_in_the_cli_and_an_argument_in_python(
    cartpole_bundle: Path, cli: Any
) -> None:
    # the CLI: rpi4 is an SSH board; the choice is refused before anything connects
    line = assert_one_error(cli("deploy", "--bundle", cartpole_bundle, "--device", "rpi4"))
    assert line.endswith("pick one, e.g. --model onnx-int8"), line
    assert "load_policy" not in line and "model=" not in line
    # the Python API: the same problem, the fix as an argument
    with pytest.raises(InputError) as e:
        load_policy(cartpole_bundle)
    assert str(e.value).endswith(f"pick one, e.g. load_policy({str(cartpole_bundle)!r}, model='onnx-int8')")
    assert "--model" not in str(e.value)
    # the other direction: a Python config error met through the CLI names the flag
    line = assert_one_error(
        cli("actorq", "--algo", "d4pg", "--env", "Pendulum-v1", "--critic-hidden", "0", "--out", "aq")
    )
    assert line.endswith("e.g. --critic-hidden 512,512,256") and "critic_hidden=" not in line, line


def _tuned_on(src: Path, dest: Path, device: str) -> Path:
    """A copy of ``src`` whose manifest says `quarl-edge tune` chose onnx-int8 on ``device``."""
    b = Path(shutil.copytree(src, dest))
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["tune"] = {"chosen": "onnx-int8", "threads": 1, "device": device, "emulated": False}
    (b / "manifest.json").write_text(json.dumps(manifest))
    return b


@pytest.mark.ssh
@pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)")
def test_deploy_to_another_board_than_the_one_tuned_on_says_so_in_one_line(
    board: Board, on_board: str, cartpole_bundle: Path, tmp_path: Path
) -> None:
    from quarl_edge.deploy import deploy

    tuned = _tuned_on(cartpole_bundle, tmp_path / "tuned", "rpi4-emu")
    lines: list[str] = []
    d = deploy(tuned, on_board, log=lines.append, name="tuned-elsewhere")
    assert d.model == "onnx-int8"  # tune's choice, deployed all the same
    warned = [x for x in lines if x.startswith("warning:")]
    assert warned == [
        f"warning: this bundle was tuned on rpi4-emu and is deployed to {on_board}: its model choice and "
        f"thread count were measured on rpi4-emu; to choose for {on_board}: quarl-edge tune --policy POLICY "
        f"--device {on_board} --out DIR"
    ]
    assert d.warnings == (warned[0].removeprefix("warning: "),)
    same = _tuned_on(cartpole_bundle, tmp_path / "tuned-here", on_board)
    lines.clear()
    assert deploy(same, on_board, log=lines.append, name="tuned-here").warnings == ()
    assert not [x for x in lines if x.startswith("warning:")]


# ---- names safe in shells, shown whole ---------------------------------------------------------------


def test_tune_names_are_safe_in_shells_and_an_old_bracket_name_is_refused_with_the_fix(
    cartpole_bundle: Path, tmp_path: Path
) -> None:
    from quarl_edge.runtimes.bundlepath import SAFE_SEGMENT
    from quarl_edge.runtimes.manifest import load_manifest
    from quarl_edge.tune.candidates import Candidate, grid

    layers = Candidate("tflite", "int8", float_layers=("mlp.0", "out"))
    assert layers.name == "tflite-int8-minmax-float-mlp.0-out"
    assert Candidate("onnx", "int8", float_layers=()).name == "onnx-int8-minmax-float-none"
    assert (
        Candidate("onnx", "int8", activation="U8S8", per_channel=True).name
        == "onnx-int8-minmax-u8s8-per-channel"
    )
    for c in [*grid(("onnx", "tflite"), cnn=False), layers]:
        assert SAFE_SEGMENT.fullmatch(c.name) and SAFE_SEGMENT.fullmatch(f"policy.{c.name}.onnx"), c.name
        assert Candidate.from_dict(c.to_dict()) == c
    # a bundle an older tune wrote: refused in one line, naming the commands that make it again
    old = Path(shutil.copytree(cartpole_bundle, tmp_path / "old"))
    manifest = json.loads((old / "manifest.json").read_text())
    entry = next(m for m in manifest["models"] if m["name"] == "onnx-int8")
    entry["name"] = "onnx-int8-minmax-float[out]"
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError) as e:
        load_manifest(old)
    assert "'onnx-int8-minmax-float[out]' has [ ] , or + (not safe in a shell)" in str(e.value)
    assert str(e.value).endswith("export the bundle again (quarl-edge export), or run quarl-edge tune again")


def test_tables_wrap_long_names_and_never_cut_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from quarl_edge.cli import _output

    names = ["tflite-int8-minmax-per-tensor-float-mlp.0-mlp.2-out", "onnx-fp32"]
    for width in (60, 80, 120):
        buf = io.StringIO()
        monkeypatch.setattr(_output, "out", Console(file=buf, width=width))
        _output.table("bench", ["model", "p50 us", "p99 us", "reward", "drop", "agree", "speedup vs fp32"],
                      [[n, "12.3", "45.6", "500.0", "+0.00%", "0.992", "1.23x"] for n in names])  # fmt: skip
        lines = buf.getvalue().splitlines()
        assert all(len(x) <= width for x in lines) and "…" not in buf.getvalue()
        first = "".join(x.split("│")[1].strip() for x in lines if x.startswith("│"))
        assert first == "".join(names), (width, buf.getvalue())


# ---- units: one rule for every percent flag, a unit on every number the gate prints -----------------


def test_percent_flags_take_a_percentage_or_a_fraction_and_refuse_a_bare_number_above_one() -> None:
    from quarl_edge.common.limits import parse_percent

    assert parse_percent("1%", "--max-miss-rate") == parse_percent("0.01", "--max-miss-rate") == 1.0
    assert parse_percent(" 2 % ") == parse_percent("0.02") == 2.0 and parse_percent("0") == 0.0
    assert parse_percent("150%") == 150.0 and parse_percent("1") == 100.0  # 1 is the whole: 100%
    with pytest.raises(InputError) as e:
        parse_percent("2", "--max-reward-drop")
    assert str(e.value) == ("--max-reward-drop 2 is ambiguous: 2% or 200%?; write --max-reward-drop 2% "
                            "(a percentage), or a fraction of one: --max-reward-drop 0.02")  # fmt: skip
    with pytest.raises(InputError, match="is not a percentage"):
        parse_percent("two")


def test_gate_reads_1_percent_and_0_01_alike_and_prints_a_unit_on_every_number(
    cartpole_bundle: Path, tmp_path: Path, cli: Any
) -> None:
    from quarl_edge.bench.report import write_report
    from quarl_edge.bench.run import BenchConfig, bench

    path, _ = write_report(
        bench(cartpole_bundle, BenchConfig(episodes=1, latency_samples=50, max_steps=40, hz=50)),
        tmp_path / "r.json",
    )
    verdicts = []
    for rate in ("1%", "0.01"):
        r = cli(
            "gate", path, "--max-miss-rate", rate, "--min-agreement", "0.9", "--max-p99-ms", "50", "--json"
        )
        assert r.returncode in (0, 1), r.stderr
        verdicts.append(json.loads(r.stdout))
    assert verdicts[0] == verdicts[1]
    miss = [c for c in verdicts[0]["checks"] if c["name"] == "deadline_miss_rate"]
    assert miss and all(c["limit"] == 1.0 and c["unit"] == "%" for c in miss)
    assert "ambiguous" in assert_one_error(cli("gate", path, "--max-miss-rate", "5"))
    r = cli("gate", path, "--max-miss-rate", "0.01", "--min-agreement", "0.9", "--max-p99-ms", "50")
    rows = [x for x in r.stdout.splitlines() if x.startswith("│")]
    by_check = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("│").split("│")]
        by_check.setdefault(cells[1], cells)
    assert by_check["reward_drop"][2].endswith(" %") and by_check["reward_drop"][3] == "2 %"
    assert by_check["deadline_miss_rate"][2].endswith(" %") and by_check["deadline_miss_rate"][3] == "1 %"
    assert by_check["p99_latency"][2].endswith(" us") and by_check["p99_latency"][3] == "50000 us"
    assert by_check["agreement"][3] == "0.9"  # a fraction of one: no unit
