"""Device-side entry point: ``python -m quarl_edge.runtimes run|info ...``.

Prints JSON lines on stdout (progress events, then one ``result``) so a host can drive a progress bar
over a pipe or an SSH channel. argparse only: the device has numpy + one runtime, nothing else of ours.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import defaults
from .errors import QuarlError
from .facts import device_info
from .fsutil import finite_json
from .schema import Event


def _emit(obj: Event) -> None:
    sys.stdout.write(json.dumps(obj, allow_nan=False, default=_default) + "\n")
    sys.stdout.flush()


def _default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m quarl_edge.runtimes")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure one model of a bundle; JSON lines on stdout")
    r.add_argument("--bundle", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--seeds", default="", help="comma-separated episode seeds")
    r.add_argument("--threads", type=int, default=defaults.THREADS)
    r.add_argument("--trace", default=None)
    r.add_argument("--latency-samples", type=int, default=defaults.LATENCY_SAMPLES)
    r.add_argument("--warmup", type=int, default=defaults.WARMUP)
    r.add_argument("--max-steps", type=int, default=None)
    r.add_argument("--no-replay", action="store_true", help="skip the trace replay (already measured)")
    r.add_argument("--hz", type=float, default=None, help="time act() in the episodes against a 1/HZ budget")
    r.add_argument(
        "--duration", type=float, default=None, help="seconds of sustained loop with thermal readings"
    )
    r.add_argument(
        "--oversubscribe", action="store_true", help="allow more threads than the device has cores"
    )
    i = sub.add_parser("info", help="device facts as JSON")
    i.add_argument("--clean-cache", default=None, help="first remove what cut uploads left in this cache")
    c = sub.add_parser(
        "receive", help="a bundle stream on stdin into the cache, verified (devices/remote.py)"
    )
    c.add_argument("--dest", required=True)
    k = sub.add_parser("verify", help="check a cached bundle against the host's manifest")
    k.add_argument("--bundle", required=True)
    n = sub.add_parser("name", help="verify a cached bundle and point a stable name at it (deploy)")
    n.add_argument("--bundle", required=True)
    n.add_argument("--root", required=True)
    n.add_argument("--name", required=True)
    for a in (c, k, n):
        a.add_argument("--manifest-sha256", required=True)
        a.add_argument("--signature-sha256", default=None)
    v = sub.add_parser("serve", help="the policy alone: observations in, actions out (bench --env-on-host)")
    v.add_argument("--bundle", required=True)
    v.add_argument("--model", required=True)
    v.add_argument("--threads", type=int, default=defaults.THREADS)
    args = p.parse_args(argv)
    try:
        if args.cmd in ("receive", "verify", "name"):
            return _cache_command(args)
        if args.cmd == "info":
            if args.clean_cache:
                from .board import clean_cache

                clean_cache(Path(args.clean_cache), time.time())
            _emit({"event": "info", **device_info()})
            return 0
        if args.cmd == "serve":
            from .serve import serve

            serve(args.bundle, args.model, args.threads, sys.stdin, _emit)
            return 0
        from .runner import run_model

        # ready to load the model: the host times its harness (process + imports) up to here
        _emit({"event": "start", "model": args.model, "runner": os.path.dirname(os.path.dirname(__file__))})
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        result = run_model(
            args.bundle,
            args.model,
            seeds=seeds,
            threads=args.threads,
            trace_path=args.trace,
            latency_samples=args.latency_samples,
            warmup=args.warmup,
            max_steps=args.max_steps,
            replay=not args.no_replay,
            progress=lambda ev: _emit(finite_json(ev)),
            oversubscribe=args.oversubscribe,
            hz=args.hz,
            duration_s=args.duration,
        )
        _emit({"event": "result", "result": finite_json(result.to_dict())})
        return 0
    except QuarlError as e:
        _emit({"event": "error", "kind": type(e).__name__, "message": e.cli_text()})
        return e.exit_code


def _cache_command(args: argparse.Namespace) -> int:
    from . import board

    sha, sig = args.manifest_sha256, args.signature_sha256
    try:
        if args.cmd == "receive":
            out = board.receive(Path(args.dest), sys.stdin.buffer, sha, sig)
        elif args.cmd == "verify":
            out = board.verify_cached(Path(args.bundle), sha, sig)
        else:
            out = board.name_bundle(Path(args.bundle), Path(args.root), args.name, sha, sig)
    except OSError as e:  # a full disk, a folder we may not write
        _emit({"event": "error", "kind": "OSError", "message": f"{args.cmd} failed on the device: {e}"})
        return 2
    _emit({"event": args.cmd, **out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
