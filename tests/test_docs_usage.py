"""docs/usage.md cannot drift from the CLI (issue 28 scope 8, issue 29 scope 8): every command and option
is in its reference, made from the CLI, with help text; `--help` shows long lists whole at 80 columns."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from quarl_edge.cli import app
from quarl_edge.cli.reference import BEGIN, END, commands, reference

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
REGENERATE = "python -m quarl_edge.cli.reference docs/usage.md"


def test_the_reference_in_usage_md_is_what_the_cli_says() -> None:
    doc = USAGE.read_text()
    assert BEGIN in doc and END in doc, f"docs/usage.md has no reference block: run `{REGENERATE}`"
    block = BEGIN + doc.split(BEGIN, 1)[1].split(END, 1)[0] + END
    assert block == reference(app), f"docs/usage.md's reference differs from the CLI: run `{REGENERATE}`"


def test_every_command_and_option_is_in_usage_md_with_what_it_does() -> None:
    doc = USAGE.read_text()
    seen = 0
    for path, cmd in commands(typer.main.get_command(app)):
        assert f"`{path}`" in doc, path
        assert (cmd.help or "").strip(), f"{path} has no help text"
        for p in cmd.params:
            names = [*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())]
            if "--help" in names:
                continue
            seen += 1
            assert (p.help or "").strip(), f"{path} {names} has no help text: say what it does"
            if p.param_type_name == "option":
                for n in names:
                    assert re.search(rf"`{re.escape(n)}[` ]", doc), f"{path} {n} is in no doc"
    assert seen > 200  # the walk found the app's options (206 when this was written)


def test_usage_md_shows_no_flag_as_a_default_that_is_not_one() -> None:
    doc = USAGE.read_text()
    gate = doc.split("### `quarl-edge gate`", 1)[1].split("###", 1)[0]
    row = next(x for x in gate.splitlines() if x.startswith("| `--min-agreement`"))
    assert "default" not in row  # without the flag gate checks reward only
    assert "| `--max-reward-drop` |" in gate and "default: 2%" in gate
    assert (
        "keeps the first\nand last layers in float" in doc
        or "keeps the first and last layers in float" in doc
    )


def test_export_help_lists_every_target_whole_at_80_columns() -> None:
    from quarl_edge.exporters.base import EXPORTERS
    from quarl_edge.exporters.targets import load_builtin

    load_builtin()
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    r = subprocess.run([sys.executable, "-m", "quarl_edge.cli", "export", "--help"], capture_output=True,
                       text=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    block = r.stdout.split("--to", 1)[1].split("--calibration", 1)[0]
    words = re.findall(r"[a-z0-9]+-[a-z0-9]+", block)
    assert "…" not in block and set(EXPORTERS) <= set(words), block
    assert all(len(line) <= 80 for line in r.stdout.splitlines())


DEVICES = USAGE.parent / "devices.md"


def test_devices_md_names_every_profile_field_and_its_example_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quarl_edge.devices.profiles import FIELDS, load_profile

    doc = DEVICES.read_text()
    table = doc.split("| field | type | default | what |", 1)[1].split("\n\n", 1)[0]
    assert {m for m in re.findall(r"^\| `([a-z_]+)` \|", table, re.M)} == set(FIELDS)
    example = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "quarl-edge").mkdir()
    (tmp_path / "quarl-edge" / "devices.toml").write_text(example)
    p = load_profile("lab-pi")
    assert (p.extends, p.host, p.user, p.port, p.arch, p.cache_dir, p.default_threads) == (
        "rpi4", "10.0.0.7", "pi", 2222, "aarch64", "/data/quarl-edge-cache", 2
    )  # fmt: skip
    assert p.cpu == load_profile("rpi4").cpu  # what it does not say comes from rpi4
    assert "...with the way out:\n" not in doc and not doc.rstrip().endswith(":")
