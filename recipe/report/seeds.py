"""Several seeds per arm: per-step mean and spread of one metric across seeds, the final-window difference between
two arms, a text table of both, and a plot of mean lines with shaded min-max bands.

One run per seed says little on a tiny model: two seeds of the same arm differ about as much as two arms do, so a
learning A/B must show the spread across seeds next to the difference between arms (``bench/learning_ab.py``).
Runs are :class:`recipe.report.load.Run` objects; a seed that never logged a metric is left out of that metric's
statistics (``n`` says how many seeds a value rests on).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from recipe.report.load import Run
from recipe.report.summary import SCORE_KEYS, series, training_steps, val_keys


def reward_key(runs: list[Run]) -> str | None:
    """The training reward every run logged: verl's ``critic/score/mean`` (else ``critic/rewards/mean``)."""
    for key in SCORE_KEYS:
        if runs and all(key in r.metrics for r in runs):
            return key
    return None


def val_key(runs: list[Run]) -> str | None:
    """The validation score (``val-core/<source>/<var>/mean@N``) every run logged; None if there is none or the
    runs disagree on which (a multi-source validation has no single curve to draw)."""
    keys = [k for k in val_keys(runs) if all(k in r.metrics for r in runs)]
    return keys[0] if len(keys) == 1 else None


def per_seed(runs: list[Run], key: str, *, train_only: bool = False) -> pd.DataFrame:
    """One column per run (its name), index ``step``: the logged values of ``key`` (``train_only``: training steps
    only, so validation-before-train's record at step 0 does not count as a reward)."""
    cols = {}
    for run in runs:
        s = series(run, key)
        if train_only:
            s = s[s.index.isin(training_steps(run))]
        cols[run.name] = s
    return pd.DataFrame(cols).sort_index()


def spread(frame: pd.DataFrame) -> pd.DataFrame:
    """Per step across seeds: ``n``, ``mean``, ``std`` (ddof 1; NaN with one seed), ``min``, ``max``."""
    return pd.DataFrame({"n": frame.count(axis=1), "mean": frame.mean(axis=1), "std": frame.std(axis=1, ddof=1),
                         "min": frame.min(axis=1), "max": frame.max(axis=1)})


class WindowDiff(NamedTuple):
    """Per-seed means over the last ``window`` logged steps, and arm B minus arm A with its standard error
    (Welch: sqrt(sa^2/na + sb^2/nb); NaN with fewer than two seeds in an arm)."""

    steps: tuple[int, int]
    a: tuple[float, ...]
    b: tuple[float, ...]
    diff: float
    se: float


def window_diff(a: pd.DataFrame, b: pd.DataFrame, window: int) -> WindowDiff:
    """Compare two arms' :func:`per_seed` frames over the last ``window`` steps both logged."""
    if window < 1:
        raise ValueError(f"window must be >= 1 step, got {window}")
    common = a.index.intersection(b.index)
    if common.empty:
        raise ValueError("the two arms logged no step in common")
    steps = common[-window:]
    va = tuple(float(x) for x in a.loc[steps].mean().dropna())
    vb = tuple(float(x) for x in b.loc[steps].mean().dropna())
    if not va or not vb:
        raise ValueError(f"an arm has no value in steps {steps[0]}..{steps[-1]}")

    def var_of_mean(v: tuple[float, ...]) -> float:
        return float(np.var(v, ddof=1)) / len(v) if len(v) > 1 else math.nan

    return WindowDiff((int(steps[0]), int(steps[-1])), va, vb, float(np.mean(vb) - np.mean(va)),
                      math.sqrt(var_of_mean(va) + var_of_mean(vb)))


def _cell(row) -> str:
    if row is None or not row["n"]:
        return "n/a"
    return f"{row['mean']:.3f} [{row['min']:.3f}, {row['max']:.3f}] n={int(row['n'])}"


def render_table(title: str, arms: dict[str, pd.DataFrame], index: str = "step") -> str:
    """A markdown table: one row per ``index`` value (step, or epoch of grouped steps), per arm
    ``mean [min, max] n=seeds``."""
    stats = {name: spread(frame) for name, frame in arms.items()}
    steps = sorted(set().union(*(s.index for s in stats.values())))
    lines = [f"### {title}", "", f"| {index} | " + " | ".join(arms) + " |", "|---:|" + "---|" * len(arms)]
    for step in steps:
        cells = [_cell(s.loc[step] if step in s.index else None) for s in stats.values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_diff(label: str, names: tuple[str, str], d: WindowDiff) -> str:
    """One line: B - A over the window, its standard error, and every seed's window mean per arm."""
    a, b = names

    def seeds(v):
        return ", ".join(f"{x:.3f}" for x in v)

    return (f"{label}, steps {d.steps[0]}-{d.steps[1]}: {b} - {a} = {d.diff:+.3f} +- {d.se:.3f} (standard error); "
            f"{a} per seed [{seeds(d.a)}] mean {np.mean(d.a):.3f}, {b} per seed [{seeds(d.b)}] mean {np.mean(d.b):.3f}")


def plot_arms(panels: list[tuple[str, dict[str, pd.DataFrame]]]) -> Figure:
    """One panel per (title, {arm: per-seed frame}): each arm's mean over seeds as a line, min-max shaded."""
    fig = Figure(figsize=(8, 3.2 * len(panels)), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    for i, (title, arms) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        for j, (name, frame) in enumerate(arms.items()):
            s = spread(frame)
            x = s.index.to_numpy()
            ax.plot(x, s["mean"].to_numpy(), marker=".", color=f"C{j}",
                    label=f"{name} (mean of {frame.shape[1]} seeds)")
            ax.fill_between(x, s["min"].to_numpy(), s["max"].to_numpy(), color=f"C{j}", alpha=0.2,
                            label=f"{name} min-max")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize="small")
    return fig


__all__ = ["WindowDiff", "per_seed", "plot_arms", "render_diff", "render_table", "reward_key", "spread", "val_key",
           "window_diff"]
