"""Study plots (matplotlib, Agg): normalized reward vs bits, and int8 drift with 95% intervals."""

from __future__ import annotations

from pathlib import Path

from quarl_edge.common.figures import pyplot, save_png
from quarl_edge.study.result import PTQStudy


def plot_reward_vs_bits(study: PTQStudy, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 5))
    by_policy: dict[str, list[tuple[int, float]]] = {}
    for s in study.results:
        if s.variant.startswith("w") and s.normalized is not None and s.bits is not None:
            by_policy.setdefault(s.policy, []).append((s.bits, s.normalized))
    colors = [plt.get_cmap("tab20")(i) for i in range(20)]
    markers = "osD^vP*Xh<>p"
    for i, (policy, pts) in enumerate(sorted(by_policy.items())):
        pts.sort()  # distinct colour and marker per policy, beyond ten policies too
        ax.plot([b for b, _ in pts], [v for _, v in pts], marker=markers[i % len(markers)],
                color=colors[(2 * i) % 20 + (i // 10) % 2], label=policy)  # fmt: skip
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="fp32 reference")
    ax.axhline(0.98, color="grey", linestyle=":", linewidth=1, label="2% below fp32")
    ax.set_xlabel("weight bits (uniform, symmetric; per-channel for conv)")
    ax.set_ylabel("normalized return  (R - R_random) / (R_fp32 - R_random)")
    ax.set_title(f"Weight-only PTQ: reward vs bits ({study.suite} suite, {study.episodes} paired episodes)")
    ax.set_xticks(study.bits)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: lines stay visible
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def plot_drift(study: PTQStudy, path: Path) -> Path:
    plt = pyplot()
    variants = ["onnx-fp16", "onnx-int8", "tflite-int8"]
    policies = sorted({s.policy for s in study.results})
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(policies) + 2), 4.5))
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        xs, ys, lo, hi = [], [], [], []
        for i, p in enumerate(policies):
            s = next((s for s in study.results if s.policy == p and s.variant == v), None)
            ci = s.drop_ci95_pct if s else None
            if s and s.drop_pct is not None and ci and ci[0] is not None and ci[1] is not None:
                xs.append(i + (j - 1) * width)
                ys.append(s.drop_pct)
                lo.append(s.drop_pct - ci[0])
                hi.append(ci[1] - s.drop_pct)
        if xs:  # points, not bars: a drift of 0 must still be visible
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=4, markersize=6, label=v)
    ax.axhline(0, color="black", linewidth=1, label="fp32 reference")
    ax.axhline(study.drift_limit_pct, color="red", linestyle="--", linewidth=1, label="2% drop limit")
    ax.set_xticks(range(len(policies)))
    ax.set_xticklabels(policies, rotation=20, ha="right")
    ax.set_ylabel("reward drop vs fp32, % of |fp32 mean| (95% CI)")
    ax.set_title("Reduced-precision drift per policy (paired seeds)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_png(fig, path)
