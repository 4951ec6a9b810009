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
