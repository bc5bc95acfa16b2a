"""PNG plots of a benchmark (matplotlib, headless): speedup per category per mode, acceptance by
draft position, and where a round's time goes."""

from __future__ import annotations

from pathlib import Path

from tandem.bench import modes as M

FILES = {"speedup": "speedup.png", "acceptance": "acceptance_by_position.png", "time": "time_breakdown.png",
         "auto_k": "auto_k_share.png"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(results: dict) -> str:
    models = results.get("models") or {}
    target = (models.get("target") or {}).get("model_name", "?")
    drafter = (models.get("drafter") or {}).get("model_name", "?")
    s = results["config"]
    decoding = "greedy" if s["temperature"] == 0 else f"T={s['temperature']}"
    return f"target {target}, drafter {drafter}; {decoding}, {s['max_tokens']} new tokens max, {s['repeats']} repeats"


def plot_speedup(results: dict, path: Path) -> None:
    plt = _plt()
    import numpy as np

    a = results["analysis"]
    cats = a["categories"] + ["overall"]
    modes = [m for m in results["mode_names"] if m not in (M.BASELINE, M.HF_PLAIN)]
    fig, ax = plt.subplots(figsize=(max(8, 1.0 * len(cats) * max(1, len(modes)) / 3 + 4), 5))
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(cats))
    for i, m in enumerate(modes):
        figs = [a["per_category"][c].get(m, {}) if c != "overall" else a["overall"].get(m, {}) for c in cats]
        key = "speedup_vs_hf_plain" if m == M.HF_ASSISTED else "speedup"
        vals = [f.get(key) or 0.0 for f in figs]
        lo = [max(0.0, v - (f.get("speedup_min") or v)) if m != M.HF_ASSISTED else 0 for v, f in zip(vals, figs)]
        hi = [max(0.0, (f.get("speedup_max") or v) - v) if m != M.HF_ASSISTED else 0 for v, f in zip(vals, figs)]
        label = "HF assisted (vs HF plain)" if m == M.HF_ASSISTED else m
        ax.bar(x + (i - (len(modes) - 1) / 2) * width, vals, width, yerr=[lo, hi], capsize=2, label=label)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(x, cats, rotation=30, ha="right")
    ax.set_ylabel("speedup (mean tokens/s / baseline's)")
    ax.set_title("Speedup per category\n" + _title(results), fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_acceptance(results: dict, path: Path) -> None:
    plt = _plt()
    a = results["analysis"]["overall"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for m in results["mode_names"]:
        rates = a.get(m, {}).get("acceptance_by_position")
        if rates:
            ax.plot(range(1, len(rates) + 1), [r if r is not None else float("nan") for r in rates], marker="o",
                    label=f"{m} (τ = {a[m]['mean_acceptance_length']:.2f})")
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no speculative mode ran", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / proposed at this position")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance by position\n" + _title(results), fontsize=9)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time(results: dict, path: Path) -> None:
    plt = _plt()
    a = results["analysis"]["overall"]
    modes = [m for m in results["mode_names"] if a.get(m, {}).get("verify_ms_per_round") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 1.3 * len(modes) * 2), 4.5))
    parts = (("draft_ms_per_round", "draft"), ("verify_ms_per_round", "verify"), ("overhead_ms_per_round",
                                                                                  "network / overhead"))
    for ax, per_token in zip(axes, (False, True)):
        bottom = [0.0] * len(modes)
        for key, label in parts:
            vals = []
            for m in modes:
                v = a[m].get(key) or 0.0
                vals.append(v / a[m]["mean_acceptance_length"] if per_token else v)
            ax.bar(modes, vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("ms per generated token (round / τ)" if per_token else "ms per round")
        ax.set_title("per generated token" if per_token else "per round", fontsize=9)
        ax.tick_params(axis="x", rotation=30)
    axes[0].legend(fontsize=8)
    fig.suptitle("Where the time goes (after the prefill)\n" + _title(results), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_auto_k(results: dict, path: Path) -> None:
    """Auto's rounds per chosen k (k = 0: plain steps), stacked, per category and overall."""
    plt = _plt()
    a = results["analysis"]
    pg = a["auto"]["per_group"]
    cats = a["categories"] + ["overall"]
    shares = [{int(k): v for k, v in ((pg.get(c, {}).get("choices") or {}).get("share_by_k") or {}).items()}
              for c in cats]
    ks = sorted({k for sh in shares for k in sh})
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(cats) + 3), 4.5))
    bottom = [0.0] * len(cats)
    cmap = plt.get_cmap("viridis", max(2, len(ks)))
    for i, k in enumerate(ks):
        vals = [sh.get(k, 0.0) for sh in shares]
        ax.bar(cats, vals, bottom=bottom, label=f"k={k}" + (" (plain step)" if k == 0 else ""), color=cmap(i))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("share of auto's rounds")
    ax.tick_params(axis="x", rotation=30)
    ax.set_title("Auto draft length: k chosen per round\n" + _title(results), fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(results: dict, out_dir: Path) -> dict[str, str]:
    out = {}
    plots = [("speedup", plot_speedup), ("acceptance", plot_acceptance), ("time", plot_time)]
    if (results.get("analysis") or {}).get("auto"):
        plots.append(("auto_k", plot_auto_k))
    for key, fn in plots:
        path = out_dir / FILES[key]
        fn(results, path)
        out[key] = str(path)
    return out
