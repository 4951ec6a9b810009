"""tune's device stages: latency of every candidate at every thread count (one model at a time on the
device), then closed-loop paired-seed reward, fastest first, with a close call re-checked on fresh seeds;
the first that passes is the choice (fp32 passes by definition, so it is never slower than fp32). Where
the policy's environment cannot run here, the action error on the recorded observations stands in for
the closed loop (by_action_error).

Rows are frozen (tune/records.py): each stage replaces a candidate's row with one that holds what it
found. Every measurement is cached under the sha256 of the model file(s) it was made on (tune/cache.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from quarl_edge.bench.result import BenchReport, Device
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bench.transport import Transport
from quarl_edge.parallel import Pool, pool
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.stats import drift_scale
from quarl_edge.tune.context import Search
from quarl_edge.tune.records import CandidateRow, Choice, Drift, Timing

Rows = dict[str, CandidateRow]


def reward_task(bundle: str, name: str, reference: str, seed: int, episodes: int) -> Drift:
    """One candidate's paired closed loop against the reference on this machine (a Ray task)."""
    cfg = BenchConfig(episodes=episodes, seed=seed, threads=1, latency_samples=0, models=(name,))
    return _drift_of(bench(Path(bundle), cfg), name, reference, episodes)


def latency(
    s: Search, bundle: Path, threads: list[int], rows: Rows, device: Device, transport: Transport
) -> None:
    measured: dict[str, list[tuple[int, Timing | None]]] = {n: [] for n in rows}
    for t in threads:
        if s.over_budget() and t > 1:
            s.notes.append(f"budget reached: latency not measured beyond {t - 1} thread(s)")
            break
        got = {n: s.state.get("latency", f"{n}@{t}", r.sha256) for n, r in rows.items()}
        missing = [n for n, v in got.items() if v is None]
        if missing:
            cfg = BenchConfig(episodes=0, threads=t, latency_samples=s.cfg.latency_samples, seed=s.cfg.seed,
                              models=tuple(missing))  # fmt: skip
            for m in bench(bundle, cfg, device=device, transport=transport).models:
                name = m.name
                if name not in missing:
                    continue  # the bench adds the reference; its measurement stands as first made
                try:
                    if m.latency is None:
                        raise InputError("none measured", "run tune again")
                    timing = Timing(m.latency.p50_us, m.latency.p99_us)
                except InputError as e:
                    s.log(f"{name} at {t} thread(s): no usable latency from the device ({e.problem})")
                    continue
                got[name] = s.state.put("latency", f"{name}@{t}", rows[name].sha256, timing)
        for n in rows:
            measured[n].append((t, got[n]))
    for n, row in rows.items():
        timed = [(t, v) for t, v in measured[n] if v is not None]
        best = min(timed, key=lambda tv: tv[1].p50_us) if timed else None
        rows[n] = replace(row, latency=tuple(measured[n]), threads=best[0] if best else None,
                          p50_us=best[1].p50_us if best else None, p99_us=best[1].p99_us if best else None)  # fmt: skip


def _screened_out(s: Search, row: CandidateRow) -> str | None:
    """Why a candidate is rejected without a closed loop (its p99 or its agreement), or None."""
    cfg = s.cfg
    if cfg.max_p99_ms is not None and row.p99_us is not None and row.p99_us > cfg.max_p99_ms * 1000:
        return f"p99 {row.p99_us / 1000:.3f} ms > {cfg.max_p99_ms:g} ms"
    if cfg.min_agreement is not None and (row.agreement or 0) < cfg.min_agreement:
        return f"agreement {row.agreement or 0:.3f} < {cfg.min_agreement:g} (screen)"
    return None


def closed_loop(s: Search, bundle: Path, rows: Rows, device: Device, transport: Transport) -> Choice | None:
    ref_name = s.reference
    rows[ref_name] = replace(rows[ref_name], verdict="pass", why="the fp32 reference", drop_pct=0.0)
    order = [r.name for r in sorted((r for r in rows.values() if r.p50_us), key=lambda r: r.p50_us or 0.0)]
    faster = [n for n in order[: order.index(ref_name)] if _screened_out(s, rows[n]) is None]
    with ExitStack() as stack:
        # workers start the first time two closed loops can run side by side, and stop with this stage
        pool_once = functools.cache(lambda: stack.enter_context(pool(s.cfg.parallel)))
        for name in order:
            if name == ref_name:
                break  # nothing faster passed: the reference is the choice
            why_not = _screened_out(s, rows[name])
            if why_not:
                rows[name] = replace(rows[name], verdict="rejected", why=why_not)
                continue
            if s.over_budget():
                rows[name] = replace(rows[name], verdict="not judged", why="the time budget ran out")
                s.notes.append("budget reached before every faster candidate was judged in closed loop")
                break
            if s.closed(name) is None:
                _judge(s, bundle, faster[faster.index(name) :], device, transport, pool_once)
            choice = _verdict(s, bundle, name, rows, device, transport)
            if choice is not None:
                return choice
    return _the_reference(s, rows)


def _the_reference(s: Search, rows: Rows) -> Choice | None:
    """Nothing faster passed: the fp32 reference is the choice, unless it is over --max-p99-ms too."""
    ref, limit = rows[s.reference], s.cfg.max_p99_ms
    if limit is not None and ref.p99_us and ref.p99_us > limit * 1000:
        rows[s.reference] = replace(
            ref, verdict="rejected", why=f"p99 {ref.p99_us / 1000:.3f} ms > {limit:g} ms"
        )
        return None
    _slower(rows, ref)
    return _choice(ref, ref, reward=s.reward_measured)


def by_action_error(
    s: Search, bundle: Path, rows: Rows, device: Device, transport: Transport
) -> Choice | None:
    """Where the policy's environment cannot run here, the verdict without a closed loop: fastest first,
    each candidate's action error against fp32 on the recorded observations (the bundle's trace, replayed
    on the device by the runner, state carried over each episode, at the candidate's threads, as the
    final bench of tune.json replays it; Agreement.action_error, the measure `gate --max-action-error`
    judges); the first within --max-action-error is the choice. No episodes run, no reward is estimated."""
    limit, ref_name = s.cfg.max_action_error, s.reference
    if limit is None:  # search.py refuses this before any work; a library caller gets the same line
        raise InputError(
            "tune without an environment needs an action-error limit", "pass --max-action-error X"
        )
    rows[ref_name] = replace(rows[ref_name], verdict="pass", why="the fp32 reference", action_error=0.0)
    order = [r.name for r in sorted((r for r in rows.values() if r.p50_us), key=lambda r: r.p50_us or 0.0)]
    for name in order:
        if name == ref_name:
            break
        row = rows[name]
        why_not = _screened_out(s, row)
        if why_not:
            rows[name] = replace(row, verdict="rejected", why=why_not)
            continue
        if s.over_budget():
            rows[name] = replace(row, verdict="not judged", why="the time budget ran out")
            s.notes.append("budget reached before every faster candidate was judged by its action error")
            break
        err = _action_error(s, bundle, row, device, transport)
        row = replace(row, action_error=err)
        if err <= limit:
            rows[name] = replace(
                row, verdict="pass", why=f"action error {err:.4g} <= {limit:g} (reward not measured)"
            )
            _slower(rows, rows[name])
            return _choice(rows[name], rows[ref_name], reward=False)
        rows[name] = replace(row, verdict="rejected", why=f"action error {err:.4g} > {limit:g}")
    return _the_reference(s, rows)


def _action_error(s: Search, bundle: Path, row: CandidateRow, device: Device, transport: Transport) -> float:
    """One candidate's action error on the device (cached for its bytes and the reference's)."""
    threads = row.threads or 1
    cached: float | None = s.measured_error(row.name, threads)
    if cached is not None:
        return cached
    s.log(f"action error: {row.name} vs {s.reference} on the recorded observations at {threads} thread(s)")
    cfg = BenchConfig(episodes=0, seed=s.cfg.seed, threads=threads, latency_samples=0, models=(row.name,))
    agreement = bench(bundle, cfg, device=device, transport=transport).model(row.name).agreement
    if agreement is None:
        raise QuarlError(f"the device replayed no recorded observations for {row.name}", "run tune again")
    return s.put_error(row.name, threads, agreement.action_error()[0])


def _judge(s: Search, bundle: Path, queue: list[str], device: Device, transport: Transport,
           pool_once: Callable[[], Pool]) -> None:  # fmt: skip
    """The closed loop of queue[0], cached; on the local device with ``--workers N``, the next N-1
    candidates' too, side by side (reward does not mind sharing the machine; latency was measured
    before, one model at a time). At most N-1 of them are wasted when queue[0] passes. A Ray cluster
    (``--address``) does not see this machine's bundle: its closed loops stay here."""
    workers = s.cfg.parallel
    todo = [n for n in queue if s.closed(n) is None][: workers.count]
    parallel = len(todo) > 1 and device.transport == "local" and workers.local
    if not parallel:
        s.put_closed(
            "closed", todo[0], _reward(s, bundle, todo[0], s.cfg.seed, s.cfg.episodes, device, transport)
        )
        return
    s.log(f"closed loop: {', '.join(todo)} vs {s.reference} side by side ({workers.backend}), "
          f"{s.cfg.episodes} paired episodes each")  # fmt: skip
    calls = [(str(bundle), n, s.reference, s.cfg.seed, s.cfg.episodes) for n in todo]
    for n, result in zip(todo, pool_once().map(reward_task, calls), strict=True):
        s.put_closed("closed", n, result)


def _verdict(
    s: Search, bundle: Path, name: str, rows: Rows, device: Device, transport: Transport
) -> Choice | None:
    """Judge one candidate on its cached closed loop (and a close call's fresh seeds); the choice if it passes."""
    cfg, limit = s.cfg, s.cfg.max_reward_drop_pct
    drift = s.closed(name)
    if drift is None or drift.drop_pct is None:
        rows[name] = replace(
            rows[name], verdict="rejected", why="reward drop undefined (the fp32 mean reward is 0)"
        )
        return None
    row = replace(
        rows[name], drop_pct=drift.drop_pct, drop_ci95_pct=drift.drop_ci95_pct, episodes_judged=drift.episodes
    )
    ok = drift.drop_pct <= limit
    lo, hi = drift.drop_ci95_pct or (math.nan, math.nan)
    # a close call either way: the paired interval holds the limit, so these episodes cannot tell;
    # fresh seeds decide, on all the episodes together
    if lo <= limit <= hi and cfg.confirm_episodes > 0 and not s.over_budget():
        more = s.closed(name, "confirm") or s.put_closed("confirm", name, _reward(
            s, bundle, name, cfg.seed + cfg.episodes, cfg.confirm_episodes, device, transport))  # fmt: skip
        pooled = _pooled_drop(drift, more)
        ok = pooled is not None and pooled <= limit
        n = drift.episodes + more.episodes
        row = replace(row, confirm_drop_pct=pooled, confirm_episodes=n, episodes_judged=n)
    drop = row.judged_drop
    if ok and drop is not None:
        again = f" over {row.confirm_episodes} episodes (a close call, re-checked on fresh seeds)"
        why = f"reward drop {drop + 0.0:+.2f}% <= {limit:g}%" + (
            again if row.confirm_drop_pct is not None else ""
        )
        rows[name] = replace(row, verdict="pass", why=why)
        _slower(rows, rows[name])
        return _choice(rows[name], rows[s.reference], reward=True)
    shown = "undefined" if drop is None else f"{drop:+.2f}%"
    rows[name] = replace(row, verdict="rejected", why=f"reward drop {shown} > {limit:g}%")
    return None


def _pooled_drop(a: Drift, b: Drift) -> float:
    """The drop over all the episodes of both, as one bench of them all reports it (from the pooled means;
    the mean of two percentages is not one when the means differ), so `gate tune.json` agrees."""
    n1, n2 = a.episodes, b.episodes
    ref = (a.ref_mean * n1 + b.ref_mean * n2) / (n1 + n2)
    mean = (a.mean * n1 + b.mean * n2) / (n1 + n2)
    return float(100.0 * (ref - mean) / drift_scale(ref))  # the drift's one rule for a zero fp32 mean


def _slower(rows: Rows, chosen: CandidateRow) -> None:
    for n, r in rows.items():
        if r.verdict is None and r.p50_us and chosen.p50_us and r.p50_us >= chosen.p50_us:
            rows[n] = replace(r, verdict="not needed", why=f"slower than {chosen.name}, which passed")


def _reward(s: Search, bundle: Path, name: str, seed: int, episodes: int, device: Device,
            transport: Transport) -> Drift:  # fmt: skip
    s.log(f"closed loop: {name} vs {s.reference}, {episodes} paired episodes from seed {seed}")
    report = bench(bundle, BenchConfig(episodes=episodes, seed=seed, threads=1, latency_samples=0, models=(name,)),
                   device=device, transport=transport)  # fmt: skip
    return _drift_of(report, name, s.reference, episodes)


def _drift_of(report: BenchReport, name: str, reference: str, episodes: int) -> Drift:
    m = report.model(name)
    if m.drift is None:
        raise QuarlError(f"no paired episodes for {name}", "run again; the runner reported none")
    mean, ref_mean = m.reward.mean, report.model(reference).reward.mean
    if mean is None or ref_mean is None:  # a drift exists only over finished pairs: both have a mean
        raise QuarlError(f"no finished episodes for {name} or {reference}", "run again")
    lo, hi = m.drift.drop_ci95_pct  # None: unbounded (one paired episode)
    return Drift(
        m.drift.reward_drop_pct, None if lo is None or hi is None else (lo, hi), episodes, mean, ref_mean
    )


def _choice(row: CandidateRow, ref: CandidateRow, reward: bool) -> Choice:
    """``reward``: judged in closed loop (else by the action error: no drop, never an estimated one)."""
    if row.threads is None or row.p50_us is None or row.p99_us is None or ref.p50_us is None:
        raise QuarlError(f"{row.name} was chosen without a latency measurement", "run tune again")
    return Choice(row.name, row.sha256, row.threads, row.p50_us, row.p99_us, ref.p50_us / row.p50_us,
                  (row.judged_drop or 0.0) if reward else None, row.episodes_judged, row.why or "",
                  None if reward else row.action_error)  # fmt: skip
