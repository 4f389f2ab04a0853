"""Comparison plots. Each ``plot_*`` returns a Figure (so tests can read back exactly what was drawn);
``write_plots`` saves them as PNG.

Figures are built on the Agg canvas directly instead of through pyplot: no global backend switch, no display
needed, and nothing to close.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from recipe.report.load import Run
from recipe.report.summary import (
    GEN_TIME,
    K3_KL,
    OUT_OF_BAND,
    RESPONSE_MAX,
    RESPONSE_MEAN,
    STEP_TIME,
    cap_per_step,
    series,
    val_curve,
    val_keys,
    val_label,
)

HIST_BINS = 50


def _figure(nrows: int = 1, height: float = 4.0) -> tuple[Figure, list]:
    fig = Figure(figsize=(9, height * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(nrows, 1, i + 1) for i in range(nrows)]


def plot_times(runs: list[Run]) -> Figure:
    """Generation time (``timing_s/gen``) and step time (``timing_s/step``) per step, one line per run."""
    fig, axes = _figure(2, 3.5)
    for ax, key, title in ((axes[0], GEN_TIME, "generation time per step"), (axes[1], STEP_TIME, "step time")):
        for run in runs:
            s = series(run, key)
            ax.plot(s.index.to_numpy(), s.to_numpy(), marker=".", label=run.name)
        ax.set_title(f"{title} ({key})")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds")
        ax.legend()
    return fig


def plot_response_lengths(runs: list[Run]) -> Figure:
    """Response-length distributions: histograms over all responses (shared bins, fraction of responses) when every
    run has traces, else per-step mean (solid) and max (dashed) from verl's ``response_length/*`` metrics."""
    fig, (ax,) = _figure()
    if all(run.traces is not None and not run.traces.empty for run in runs):
        lengths = [run.traces["response_length"].to_numpy() for run in runs]
        edges = np.histogram_bin_edges(np.concatenate(lengths), bins=HIST_BINS)
        for run, x in zip(runs, lengths):
            counts, _ = np.histogram(x, bins=edges)
            ax.stairs(counts / len(x), edges, label=run.name)
        ax.set_title("response length distribution (length traces)")
        ax.set_xlabel("response length [tokens]")
        ax.set_ylabel("fraction of responses")
    else:
        for i, run in enumerate(runs):
            color = f"C{i}"
            for key, style, stat in ((RESPONSE_MEAN, "-", "mean"), (RESPONSE_MAX, "--", "max")):
                s = series(run, key)
                ax.plot(s.index.to_numpy(), s.to_numpy(), style, color=color, label=f"{run.name} {stat}")
        ax.set_title("response length per step (response_length/mean, /max)")
        ax.set_xlabel("step")
        ax.set_ylabel("tokens")
    ax.legend()
    return fig


def plot_cap(runs: list[Run]) -> Figure:
    """Response cap per step (gaps where it is off) with each run's longest response per step for reference."""
    fig, (ax,) = _figure()
    for i, run in enumerate(runs):
        cap = cap_per_step(run)
        ax.plot(cap.index.to_numpy(), cap.to_numpy(), color=f"C{i}", marker=".", label=f"{run.name} cap")
        longest = series(run, RESPONSE_MAX)
        ax.plot(longest.index.to_numpy(), longest.to_numpy(), ":", color=f"C{i}", label=f"{run.name} max length")
    ax.set_title("response cap per step (rollout/response_max_tokens_cap; gaps = off)")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax.legend()
    return fig


def plot_val_score(runs: list[Run]) -> Figure:
    """Validation score (verl's ``val-core/<source>/<var>/mean@N``) over steps and over training time (the sum of
    ``timing_s/step``): the second panel shows whether a speedup reached the same score sooner or cost accuracy."""
    fig, (by_step, by_time) = _figure(2, 3.5)
    keys = val_keys(runs)
    for i, run in enumerate(runs):
        for j, key in enumerate(keys):
            curve = val_curve(run, key)
            label = run.name if len(keys) == 1 else f"{run.name} {val_label(key)}"
            style = dict(color=f"C{i}", linestyle=("-", "--", ":", "-.")[j % 4], marker=".", label=label)
            by_step.plot(curve.index.to_numpy(), curve["score"].to_numpy(), **style)
            timed = curve.dropna(subset=["time_s"])
            by_time.plot(timed["time_s"].to_numpy() / 3600, timed["score"].to_numpy(), **style)
    what = val_label(keys[0]) if len(keys) == 1 else "val-core/*/mean@N"
    by_step.set_title(f"validation score over steps ({what})" if keys else "no validation score logged (val-core/*)")
    by_step.set_xlabel("step")
    by_time.set_title(f"validation score over training time (sum of {STEP_TIME}; validation and startup excluded)")
    by_time.set_xlabel("training time [h]")
    for ax in (by_step, by_time):
        ax.set_ylabel("score")
        if keys:
            ax.legend()
    return fig


def plot_mismatch(runs: list[Run]) -> Figure:
    """Training-inference mismatch per step: verl's k3 KL (log scale) and the share of trained tokens whose
    train/rollout ratio leaves [1/2, 2]; e.g. router replay on against off."""
    fig, (k3_ax, band_ax) = _figure(2, 3.5)
    for ax, key in ((k3_ax, K3_KL), (band_ax, OUT_OF_BAND)):
        for run in runs:
            s = series(run, key)
            ax.plot(s.index.to_numpy(), s.to_numpy(), marker=".", label=run.name)
        ax.set_xlabel("step")
        ax.legend()
    k3_ax.set_title(f"k3 KL between trainer and rollout log-probs ({K3_KL})")
    k3_ax.set_ylabel("k3 KL")
    if any((series(run, K3_KL) > 0).any() for run in runs):
        k3_ax.set_yscale("log")
    band_ax.set_title(f"trained tokens with ratio outside [1/2, 2] ({OUT_OF_BAND})")
    band_ax.set_ylabel("share of tokens")
    return fig


SPEC_TOKENS = "rollout/spec_acceptance_length"  # 1 + accepted per draft: tokens per verify step (spec_metrics.py)
HEAD_TOP1 = "draft_head/top1_before_train"  # the online head's first-draft agreement on the step's new data


def plot_speculation(runs: list[Run]) -> Figure:
    """Speculative decoding per step: tokens per verify step from vLLM's counters (any drafter), and where the
    eagle3 head learns online, its top-1 agreement on each step's rollouts before it trains on them; e.g. a
    frozen head against an online one (bench/draft_online_ab.py)."""
    fig, (acc_ax, head_ax) = _figure(2, 3.5)
    for ax, key in ((acc_ax, SPEC_TOKENS), (head_ax, HEAD_TOP1)):
        for i, run in enumerate(runs):
            s = series(run, key)
            if not s.empty:
                ax.plot(s.index.to_numpy(), s.to_numpy(), marker=".", color=f"C{i}", label=run.name)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    acc_ax.set_title(f"accepted draft tokens per draft + 1 ({SPEC_TOKENS})")
    acc_ax.set_ylabel("tokens per verify step")
    head_ax.set_title(f"online head: first draft's top-1 on the step's rollouts, before training on them\n({HEAD_TOP1})")
    head_ax.set_ylabel("top-1 agreement")
    return fig


PLOTS = {
    "time_per_step.png": plot_times,
    "response_length.png": plot_response_lengths,
    "cap.png": plot_cap,
    "val_score.png": plot_val_score,
    "mismatch.png": plot_mismatch,
    "speculation.png": plot_speculation,
}


def write_plots(runs: list[Run], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Save every plot under ``out_dir`` (created if needed); returns file name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, plot in PLOTS.items():
        paths[name] = out / name
        plot(runs).savefig(paths[name])
    return paths
