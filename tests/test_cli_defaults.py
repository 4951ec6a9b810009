"""Each default defined once: a CLI option not given is None and the config's own default stands; the help
shows that default, read from the config. The commands are parsed by the CLI's own parser (click), not
run: what is checked is the config the command builds (library-level, no subprocess)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import typer

from quarl_edge.cli import app
from quarl_edge.cli._defaults import READ, shown


def _command(name: str) -> Any:
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def _parsed(name: str, *argv: str) -> dict[str, Any]:
    """The parameters the CLI's parser makes of ``quarl-edge NAME ARGV`` (parsed, not invoked)."""
    return dict(_command(name).make_context(name, list(argv)).params)


def _actorq_args(*argv: str) -> Any:
    from quarl_edge.cli.actorq import actorq_args

    params = _parsed("actorq", *argv)
    params.pop("as_json")
    return actorq_args(**params)


def test_actorq_d4pg_without_steps_runs_d4pgs_own_default(tmp_path: Path) -> None:
    """The defect: the CLI passed steps=50_000 always, so D4PG's own default (20,000) was never used."""
    from quarl_edge.actorq import d4pg, dqn

    args = _actorq_args("--algo", "d4pg", "--env", "Pendulum-v1", "--out", str(tmp_path))
    assert isinstance(args, d4pg.Args) and args.steps == d4pg.Args.steps == 20_000
    assert args.hidden == d4pg.Args.hidden and args.algo == "d4pg"
    dqn_args = _actorq_args("--env", "CartPole-v1", "--out", str(tmp_path))
    assert isinstance(dqn_args, dqn.Args) and dqn_args.steps == dqn.Args.steps == 50_000
    given = _actorq_args("--algo", "d4pg", "--env", "Pendulum-v1", "--out", str(tmp_path), "--steps", "300",
                         "--actors", "3")  # fmt: skip
    assert (given.steps, given.actors) == (300, 3)


def test_a_learners_own_setting_is_refused_for_the_other_in_one_line(tmp_path: Path) -> None:
    from quarl_edge.runtimes.errors import InputError

    with pytest.raises(InputError, match="--critic-hidden is not a setting of --algo dqn \\(it is d4pg's\\)"):
        _actorq_args("--env", "CartPole-v1", "--out", str(tmp_path), "--critic-hidden", "64,64")
    with pytest.raises(InputError, match="unknown --algo 'a3c'.*dqn, d4pg"):
        _actorq_args("--algo", "a3c", "--env", "CartPole-v1", "--out", str(tmp_path))


def test_bench_options_not_given_are_none_and_the_help_shows_benchconfigs_defaults() -> None:
    from quarl_edge.bench.config import BenchConfig

    params = _parsed("bench", "--bundle", "b")
    assert all(params[k] is None for k in ("episodes", "seed", "threads", "latency_samples"))
    helps = {p.name: p.help for p in _command("bench").params}
    assert f"(default {BenchConfig.episodes})" in helps["episodes"]
    assert f"(default {BenchConfig.latency_samples})" in helps["latency_samples"]


def test_every_default_the_help_reads_from_source_is_the_imported_configs() -> None:
    typer.main.get_command(app)  # builds every command's help: each source_default call is recorded
    assert {("quarl_edge.actorq.d4pg", "Args", "steps"), ("quarl_edge.record", "RecordConfig", "episodes"),
            ("quarl_edge.exporters.base", "ExportConfig", "calibration_method")} <= set(READ)  # fmt: skip
    for module, config, name in sorted(set(READ)):
        cls = getattr(importlib.import_module(module), config)
        field = cls.__dataclass_fields__[name]
        assert shown(field.default) != "" and shown(field.default) == _source_value(module, config, name)


def _source_value(module: str, config: str, name: str) -> str:
    from quarl_edge.cli._defaults import source_default

    return source_default(module, config, name)
