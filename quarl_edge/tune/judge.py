"""tune's device stages: latency of every candidate at every thread count (one model at a time on the
device), then closed-loop paired-seed reward, fastest first, with a close call re-checked on fresh seeds;
the first that passes is the choice (fp32 passes by definition, so it is never slower than fp32)."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quarl_edge.bench.result import BenchReport
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.stats import drift_scale
from quarl_edge.study._common import ray_session

if TYPE_CHECKING:
    from quarl_edge.tune.search import Search

MAX_PARALLEL = 4  # closed loops side by side on the local device (Ray tasks), at most


def reward_task(bundle: str, name: str, reference: str, seed: int, episodes: int) -> dict[str, Any]:
    """One candidate's paired closed loop against the reference on this machine (a Ray task)."""
    cfg = BenchConfig(episodes=episodes, seed=seed, threads=1, latency_samples=0, models=(name,))
    return _drift_of(bench(Path(bundle), cfg), name, reference, episodes)


def latency(s: Search, bundle: Path, threads: list[int], rows: dict[str, dict[str, Any]], device: dict[str, Any],
             transport: Any) -> None:  # fmt: skip
    for t in threads:
        if s.over_budget() and t > 1:
            s.notes.append(f"budget reached: latency not measured beyond {t - 1} thread(s)")
            break
        missing = [n for n in rows if s.state.get("latency", f"{n}@{t}") is None]
        if missing:
            cfg = BenchConfig(episodes=0, threads=t, latency_samples=s.cfg.latency_samples, seed=s.cfg.seed,
                              models=tuple(missing))  # fmt: skip
            report = bench(bundle, cfg, device=device, transport=transport)
            for m in report.models:
                if m.name not in missing:
                    continue  # the bench adds the reference; its measurement stands as first made
                got = m.latency
                s.state.put("latency", f"{m.name}@{t}",
                            {"p50_us": got.p50_us if got else None, "p99_us": got.p99_us if got else None})  # fmt: skip
        for n, row in rows.items():
            row.setdefault("latency", {})[str(t)] = s.state.get("latency", f"{n}@{t}")
    for row in rows.values():
        lat = {t: v for t, v in row["latency"].items() if v and v.get("p50_us")}
        best = min(lat, key=lambda t: lat[t]["p50_us"]) if lat else None
        row["threads"] = int(best) if best else None
        row["p50_us"] = lat[best]["p50_us"] if best else None
        row["p99_us"] = lat[best]["p99_us"] if best else None


def _screened_out(cfg: Any, row: dict[str, Any]) -> str | None:
    """Why a candidate is rejected without a closed loop (its p99 or its agreement), or None."""
    if cfg.max_p99_ms is not None and row["p99_us"] > cfg.max_p99_ms * 1000:
        return f"p99 {row['p99_us'] / 1000:.3f} ms > {cfg.max_p99_ms:g} ms"
    if cfg.min_agreement is not None and (row.get("agreement") or 0) < cfg.min_agreement:
        return f"agreement {row['agreement']:.3f} < {cfg.min_agreement:g} (screen)"
    return None


def closed_loop(s: Search, bundle: Path, rows: dict[str, dict[str, Any]],
                 device: dict[str, Any], transport: Any) -> dict[str, Any] | None:  # fmt: skip
    cfg = s.cfg
    ref = rows[s.reference]
    ref.update(verdict="pass", why="the fp32 reference", drop_pct=0.0)
    order = sorted((r for r in rows.values() if r.get("p50_us")), key=lambda r: r["p50_us"])
    faster = [r["name"] for r in order[: order.index(ref)] if _screened_out(cfg, r) is None]
    with ExitStack() as stack:
        # Ray starts the first time two closed loops can run side by side, and stops with this stage
        ray_once = functools.cache(lambda: stack.enter_context(ray_session(None)))
        for row in order:
            name = row["name"]
            if name == s.reference:
                break  # nothing faster passed: the reference is the choice
            why_not = _screened_out(cfg, row)
            if why_not:
                row.update(verdict="rejected", why=why_not)
                continue
            if s.over_budget():
                row.update(verdict="not judged", why="the time budget ran out")
                s.notes.append("budget reached before every faster candidate was judged in closed loop")
                break
            if s.state.get("closed", name) is None:
                _judge(s, bundle, faster[faster.index(name) :], device, transport, ray_once)
            choice = _verdict(s, bundle, row, rows, ref, device, transport)
            if choice is not None:
                return choice
    if cfg.max_p99_ms is not None and ref["p99_us"] and ref["p99_us"] > cfg.max_p99_ms * 1000:
        ref.update(verdict="rejected", why=f"p99 {ref['p99_us'] / 1000:.3f} ms > {cfg.max_p99_ms:g} ms")
        return None
    _slower(rows, ref)
    return _choice(ref, ref)


def _judge(s: Search, bundle: Path, queue: list[str], device: dict[str, Any], transport: Any,
           ray_once: Callable[[], Any]) -> None:  # fmt: skip
    """The closed loop of queue[0], cached; on the local device with Ray installed, the next candidates'
    too, as Ray tasks side by side (reward does not mind sharing the machine; latency was measured
    before, one model at a time). At most width-1 of them are wasted when queue[0] passes."""
    width = min(os.cpu_count() or 1, MAX_PARALLEL)
    todo = [n for n in queue if s.state.get("closed", n) is None][:width]
    parallel = (len(todo) > 1 and device.get("transport") == "local" and s.cfg.address is None
                and importlib.util.find_spec("ray") is not None)  # fmt: skip
    if not parallel:
        s.state.put(
            "closed", todo[0], _reward(s, bundle, todo[0], s.cfg.seed, s.cfg.episodes, device, transport)
        )
        return
    ray = ray_once()
    s.log(
        f"closed loop: {', '.join(todo)} vs {s.reference} side by side (Ray), {s.cfg.episodes} paired episodes each"
    )
    task = ray.remote(num_cpus=1)(reward_task)
    refs = [task.remote(str(bundle), n, s.reference, s.cfg.seed, s.cfg.episodes) for n in todo]
    for n, result in zip(todo, ray.get(refs), strict=True):
        s.state.put("closed", n, result)


def _verdict(s: Search, bundle: Path, row: dict[str, Any], rows: dict[str, dict[str, Any]], ref: dict[str, Any],
             device: dict[str, Any], transport: Any) -> dict[str, Any] | None:  # fmt: skip
    """Judge one candidate on its cached closed loop (and a close call's fresh seeds); the choice if it passes."""
    cfg, name = s.cfg, row["name"]
    drift = s.state.get("closed", name)
    row.update(drop_pct=drift["drop_pct"], drop_ci95_pct=drift["drop_ci95_pct"], episodes_judged=cfg.episodes)
    ok = drift["drop_pct"] <= cfg.max_reward_drop_pct
    lo, hi = drift["drop_ci95_pct"]
    # a close call either way: the paired interval holds the limit, so these episodes cannot tell;
    # fresh seeds decide, on all the episodes together
    if lo <= cfg.max_reward_drop_pct <= hi and cfg.confirm_episodes > 0 and not s.over_budget():
        more = s.state.get("confirm", name) or s.state.put("confirm", name, _reward(
            s, bundle, name, cfg.seed + cfg.episodes, cfg.confirm_episodes, device, transport))  # fmt: skip
        n1, n2 = cfg.episodes, cfg.confirm_episodes
        pooled = _pooled_drop(drift, more, n1, n2)
        ok = pooled <= cfg.max_reward_drop_pct
        row.update(confirm_drop_pct=pooled, confirm_episodes=n1 + n2, episodes_judged=n1 + n2)
    limit = f"{cfg.max_reward_drop_pct:g}%"
    if ok:
        shown = row.get("confirm_drop_pct", row["drop_pct"])
        again = f" over {row.get('confirm_episodes')} episodes (a close call, re-checked on fresh seeds)"
        row.update(verdict="pass", why=f"reward drop {shown + 0.0:+.2f}% <= {limit}" + (again if "confirm_drop_pct" in row else ""))  # fmt: skip
        _slower(rows, row)
        return _choice(row, ref)
    row.update(
        verdict="rejected",
        why=f"reward drop {row.get('confirm_drop_pct', row['drop_pct']):+.2f}% > {limit}",
    )
    return None


def _pooled_drop(a: dict[str, Any], b: dict[str, Any], n1: int, n2: int) -> float:
    """The drop over all n1 + n2 episodes, as one bench of them all reports it (from the pooled means;
    the mean of two percentages is not one when the means differ), so `gate tune.json` agrees."""
    ref = (a["ref_mean"] * n1 + b["ref_mean"] * n2) / (n1 + n2)
    mean = (a["mean"] * n1 + b["mean"] * n2) / (n1 + n2)
    return float(100.0 * (ref - mean) / drift_scale(ref))  # the drift's one rule for a zero fp32 mean


def _slower(rows: dict[str, dict[str, Any]], chosen: dict[str, Any]) -> None:
    for r in rows.values():
        if "verdict" not in r and r.get("p50_us") and r["p50_us"] >= chosen["p50_us"]:
            r.update(verdict="not needed", why=f"slower than {chosen['name']}, which passed")


def _reward(s: Search, bundle: Path, name: str, seed: int, episodes: int, device: dict[str, Any],
            transport: Any) -> dict[str, Any]:  # fmt: skip
    s.log(f"closed loop: {name} vs {s.reference}, {episodes} paired episodes from seed {seed}")
    report = bench(bundle, BenchConfig(episodes=episodes, seed=seed, threads=1, latency_samples=0, models=(name,)),
                   device=device, transport=transport)  # fmt: skip
    return _drift_of(report, name, s.reference, episodes)


def _drift_of(report: BenchReport, name: str, reference: str, episodes: int) -> dict[str, Any]:
    m = report.model(name)
    if m.drift is None:
        raise QuarlError(f"no paired episodes for {name}", "run again; the runner reported none")
    lo, hi = m.drift.drop_ci95_pct  # None: unbounded (one paired episode)
    return {"drop_pct": m.drift.reward_drop_pct, "drop_ci95_pct": [-math.inf if lo is None else lo, math.inf if hi is None else hi],
            "episodes": episodes, "mean": m.reward.mean, "ref_mean": report.model(reference).reward.mean}  # fmt: skip


def _choice(row: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    speed = ref["p50_us"] / row["p50_us"] if row.get("p50_us") and ref.get("p50_us") else None
    return {"name": row["name"], "threads": row["threads"], "p50_us": row["p50_us"], "p99_us": row["p99_us"],
            "speedup_vs_fp32": speed, "drop_pct": row.get("confirm_drop_pct", row.get("drop_pct")),
            "episodes": row.get("episodes_judged"), "why": row.get("why")}  # fmt: skip
