"""The RL Zoo folder importer: a Hugging Face model folder as downloaded (one ``algo-Env.zip``,
``vec_normalize.pkl`` and ``args.yml`` beside it) or an RL Zoo training log folder (``Env.zip``,
``best_model.zip``, ``Env/args.yml``, ``Env/vecnormalize.pkl``). The environment and algorithm come from
``args.yml`` (read with a loader that builds plain data only), else from the zip's or the folder's name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quarl_edge.policy.importers import LoadOptions, Source, register
from quarl_edge.policy.net import Policy, is_checkpoint
from quarl_edge.policy.sb3_zip import load_zip, names_from_filename
from quarl_edge.runtimes.errors import InputError

_MAX_ARGS_BYTES = 1 << 20
_STATS = ("vec_normalize.pkl", "vecnormalize.pkl")


def _args_file(folder: Path) -> Path | None:
    here = folder / "args.yml"
    if here.is_file():
        return here
    nested = sorted(p for p in folder.glob("*/args.yml") if p.is_file())
    return nested[0] if len(nested) == 1 else None


def read_args(path: Path) -> dict[str, Any]:
    """RL Zoo's ``args.yml``: a YAML dump of an OrderedDict (a python/object tag over a list of pairs).
    Read with yaml's safe loader plus that one tag, built as a plain dict; anything else is refused."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def ordered(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
        pairs = loader.construct_sequence(node.value[0], deep=True) if isinstance(node.value, list) else []
        return {str(p[0]): p[1] for p in pairs if isinstance(p, list) and len(p) == 2}

    _Loader.add_constructor("tag:yaml.org,2002:python/object/apply:collections.OrderedDict", ordered)
    fix = "pass --env ENV_ID (and --algo) instead"
    if path.stat().st_size > _MAX_ARGS_BYTES:
        raise InputError(f"{str(path)!r} is too large to be RL Zoo's args.yml", fix)
    try:
        data = yaml.load(path.read_text(errors="replace"), Loader=_Loader)  # noqa: S506 (safe loader + one tag)
    except yaml.YAMLError as e:
        raise InputError(
            f"{str(path)!r} is not readable YAML ({str(e).splitlines()[0][:120]})", fix
        ) from None
    return data if isinstance(data, dict) else {}


def _zip(folder: Path, env: str | None) -> Path:
    zips = sorted(p for p in folder.glob("*.zip") if p.is_file())
    if env and len(zips) > 1:  # a training log folder: the final model is named after the env
        final = folder / f"{env.replace('/', '-')}.zip"
        if final.is_file():
            return final
    if not zips:
        raise InputError(
            f"{str(folder)!r} is neither a quarl-edge checkpoint (no policy.json) nor an RL Zoo folder (no .zip)",
            "pass a folder written by `quarl-edge train`, an SB3 .zip, or an RL Zoo model folder",
        )
    if len(zips) > 1:
        raise InputError(
            f"{str(folder)!r} holds {len(zips)} model zips ({', '.join(z.name for z in zips[:4])})",
            "pass the one to use: --policy FOLDER/NAME.zip",
        )
    return zips[0]


def _load(folder: Path, opts: LoadOptions) -> Policy:
    args_path = _args_file(folder)
    args = read_args(args_path) if args_path else {}
    env = str(args["env"]) if isinstance(args.get("env"), str) else None
    algo = str(args["algo"]) if isinstance(args.get("algo"), str) else None
    model = _zip(folder, env)
    if env is None and names_from_filename(model)[1] is None:
        env = names_from_filename(Path(folder.name + ".zip"))[1]  # the folder's RL Zoo name
    near = [folder] + ([args_path.parent] if args_path else [])
    stats = next((d / n for d in near for n in _STATS if (d / n).is_file()), None)
    return load_zip(
        model,
        LoadOptions(
            env_id=opts.env_id,
            algo=opts.algo or algo,
            vecnormalize=opts.vecnormalize or stats,
            env_hint=opts.env_hint or env,
            env_hint_from=opts.env_hint_from if opts.env_hint else "args.yml" if args_path else "folder name",
        ),
    )


register(Source("rl-zoo-folder", "an RL Zoo / Hugging Face model folder (one .zip, vec_normalize.pkl, args.yml)",
                lambda p: p.is_dir() and not is_checkpoint(p), _load))  # fmt: skip
