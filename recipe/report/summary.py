"""A-vs-B comparison table over the metrics verl 0.9.1's v1 trainer and this recipe log.

Metric names are those of verl 0.9.1 (``verl/trainer/ppo/metric_utils.py``, ``verl/trainer/ppo/v1/trainer_base.py``)
and of the recipe's rollout adapter. A metric a run did not log shows as "n/a" rather than failing the report, so
a plain-verl baseline can be compared with a recipe run.
"""
from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from recipe.report.load import Run
from recipe.traces import TRUNCATED

GEN_TIME = "timing_s/gen"
STEP_TIME = "timing_s/step"
THROUGHPUT = "perf/throughput"
RESPONSE_MEAN = "response_length/mean"
RESPONSE_MAX = "response_length/max"
CLIP_RATIO = "response_length/clip_ratio"
SCORE_KEYS = ("critic/score/mean", "critic/rewards/mean")
CAP = "rollout/response_max_tokens_cap"
# Training-inference mismatch on trained tokens: verl's k3 KL (logged when the rollout returns log-probs) and the
# recipe's share of tokens whose ratio leaves [1/2, 2] (recipe/core/mismatch.py); router replay shrinks both
K3_KL = "rollout_corr/k3_kl"
OUT_OF_BAND = "rollout/mismatch/ratio_out_of_band"
CAP_HIT = "rollout/cap_hit_ratio"
VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
LAST_STEPS = 10


class Row(NamedTuple):
    label: str
    a: float | None
    b: float | None
    ratio: float | None


def _clean(v) -> float | None:
    return None if v is None or not math.isfinite(float(v)) else float(v)


def series(run: Run, key: str) -> pd.Series:
    """Logged values of one metric by step (empty when the run never logged it)."""
    if key not in run.metrics:
        return pd.Series(dtype="float64")
    return run.metrics[key].dropna()


def training_steps(run: Run) -> pd.Index:
    """Steps with at least one non-validation metric (verl logs validation-before-train as a record of its own)."""
    train_cols = [c for c in run.metrics.columns if not c.startswith("val-")]
    return run.metrics.index[run.metrics[train_cols].notna().any(axis=1)] if train_cols else run.metrics.index[:0]


def cap_per_step(run: Run) -> pd.Series:
    """Response cap by step, NaN when off: the recipe's metric (0 = off), else the traces' ``cap`` (null = off)."""
    cap = series(run, CAP)
    if cap.empty and run.traces is not None and not run.traces.empty:
        cap = run.traces.groupby("step")["cap"].first().astype("float64")
    return cap.where(cap > 0)


def epoch_per_step(run: Run) -> pd.Series:
    """Epoch of each step: the traces' (the recipe's sampler epoch), else verl's ``training/epoch``."""
    if run.traces is not None and not run.traces.empty:
        return run.traces.groupby("step")["epoch"].first().astype("float64")
    return series(run, "training/epoch")


def _stats(s: pd.Series) -> dict[str, float | None]:
    if s.empty:
        return dict.fromkeys(("mean", "p50", "p95", "max"))
    v = s.to_numpy()
    return {"mean": v.mean(), "p50": np.percentile(v, 50), "p95": np.percentile(v, 95), "max": v.max()}


def truncation(run: Run) -> tuple[float | None, str | None]:
    """(fraction of responses that stopped at the cap or at ``response_length``, source).

    From traces when present (finish reason per response). Otherwise per step ``response_length/clip_ratio`` (verl:
    responses at exactly ``response_length``) plus ``rollout/cap_hit_ratio`` (recipe: responses at their cap),
    averaged over steps. The two are disjoint because a cap is only set below ``response_length``; a run without the
    recipe's metric had no cap, so its clip ratio alone is the truncated fraction.
    """
    if run.traces is not None and not run.traces.empty:
        return float(run.traces["finish_reason"].isin(TRUNCATED).mean()), "traces"
    clip = series(run, CLIP_RATIO)
    if clip.empty:
        return None, None
    cap_hit = series(run, CAP_HIT)
    if cap_hit.empty:
        return float(clip.mean()), "clip_ratio"
    return float(clip.add(cap_hit, fill_value=0.0).mean()), "clip_ratio+cap_hit_ratio"


def summarize(run: Run) -> dict[str, float | None]:
    """Label -> value for one run (None = not logged). Percentiles use linear interpolation (numpy default)."""
    out: dict[str, float | None] = {}
    steps = training_steps(run)
    out["training steps"] = len(steps)
    out["last step"] = steps.max() if len(steps) else None
    gen, step = series(run, GEN_TIME), series(run, STEP_TIME)
    for label, s in (("gen time/step", gen), ("step time", step)):
        for stat, v in _stats(s).items():
            out[f"{label} {stat} [s]"] = v
    out["total step time [s]"] = step.sum() if not step.empty else None
    # the first epoch apart: a warm-started arm knows its lengths from the start, a cold one only from epoch 1 on
    epoch = epoch_per_step(run).reindex(gen.index)
    first, later = epoch == epoch.min(), epoch > epoch.min()
    out["gen time/step mean, first epoch [s]"] = gen[first].mean() if first.any() else None
    out["gen time/step mean, later epochs [s]"] = gen[later].mean() if later.any() else None
    both = gen.index.intersection(step.index)
    out["gen share of step time"] = gen[both].sum() / step[both].sum() if len(both) and step[both].sum() else None
    out["throughput mean [tok/s/GPU]"] = series(run, THROUGHPUT).mean()
    out["response length mean [tok]"] = series(run, RESPONSE_MEAN).mean()
    out["response length max [tok]"] = series(run, RESPONSE_MAX).max()
    cap = cap_per_step(run)
    out["cap mean over capped steps [tok]"] = cap.mean()
    out["capped steps fraction"] = cap.notna().mean() if not cap.empty else None
    out["cap hit ratio mean"] = series(run, CAP_HIT).mean()
    k3, band = series(run, K3_KL), series(run, OUT_OF_BAND)
    out[f"train-inference k3 KL mean ({K3_KL})"] = k3.mean()
    out["train-inference k3 KL max over steps"] = k3.max()
    out["tokens with train/rollout ratio outside [1/2, 2], mean share"] = band.mean()
    score = next((s for k in SCORE_KEYS if not (s := series(run, k)).empty), pd.Series(dtype="float64"))
    out["train reward mean (all steps)"] = score.mean()
    out[f"train reward mean (last {LAST_STEPS} steps)"] = score.iloc[-LAST_STEPS:].mean()
    return {k: _clean(v) for k, v in out.items()}


def val_keys(runs: list[Run]) -> list[str]:
    """verl's core validation scores (``val-core/<source>/<var>/mean@N``) logged by any of the runs."""
    return sorted({k for r in runs for k in r.metrics.columns if VAL_CORE.match(k)})


def val_label(key: str) -> str:
    m = VAL_CORE.match(key)
    return f"{m['source']} {m['var']}/mean@{m['n']}"


def cumulative_time(run: Run) -> pd.Series:
    """Training time up to and including each logged step: the sum of ``timing_s/step`` (empty if never logged).

    verl times validation (``timing_s/testing``), startup and a crashed launch's lost steps outside it, so this is
    the training cost of reaching a step; validation at step s runs after step s, so its score is at cum[s].
    """
    cum = series(run, STEP_TIME).cumsum()
    if cum.empty:
        return cum
    return cum.reindex(run.metrics.index, method="ffill").fillna(0.0)  # before the first step (val before train): 0


def val_curve(run: Run, key: str) -> pd.DataFrame:
    """One validation score by step with the training time spent to reach it (NaN when no step time is logged)."""
    score = series(run, key)
    time_s = cumulative_time(run).reindex(score.index)
    return pd.DataFrame({"score": score, "time_s": time_s}, index=score.index)


def _time_to(curve: pd.DataFrame, target: float) -> float | None:
    reached = curve[curve["score"] >= target]
    return None if reached.empty else _clean(reached["time_s"].iloc[0])


def _val_rows(a: Run, b: Run) -> list[Row]:
    rows = []
    for key in val_keys([a, b]):
        name = f"val {val_label(key)}"
        sa, sb = series(a, key), series(b, key)
        for stat, fa, fb in (
            ("last", sa.iloc[-1] if len(sa) else None, sb.iloc[-1] if len(sb) else None),
            ("best", sa.max(), sb.max()),
        ):
            rows.append(_row(f"{name} {stat}", _clean(fa), _clean(fb)))
        if len(sa) and len(sb):  # time-to-score: the first validation at or above the score both runs reach
            target = min(sa.max(), sb.max())
            ta, tb = _time_to(val_curve(a, key), target), _time_to(val_curve(b, key), target)
            rows.append(_row(f"{name} training time to reach {target:.4g} [s]", ta, tb))
    return rows


def _row(label: str, a: float | None, b: float | None) -> Row:
    ratio = b / a if a is not None and b is not None and a != 0 else None
    return Row(label, a, b, ratio)


def compare(a: Run, b: Run) -> list[Row]:
    """Table rows for A vs B, with ratio B/A (None when either side is missing or A is 0)."""
    sa, sb = summarize(a), summarize(b)
    rows = [_row(label, sa[label], sb[label]) for label in sa]
    (ta, src_a), (tb, src_b) = truncation(a), truncation(b)
    rows.append(_row(f"truncated fraction (cap+length; from {src_a or 'n/a'} / {src_b or 'n/a'})", ta, tb))
    return rows + _val_rows(a, b)


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 1e4:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def render_markdown(rows: list[Row], names: tuple[str, str]) -> str:
    """A markdown table: metric | A | B | B/A."""
    lines = [f"| metric | {names[0]} | {names[1]} | {names[1]}/{names[0]} |", "|---|---:|---:|---:|"]
    for r in rows:
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append(f"| {r.label} | {_fmt(r.a)} | {_fmt(r.b)} | {ratio} |")
    return "\n".join(lines) + "\n"


def render_sources(runs: list[Run]) -> str:
    """Which files each run was read from and what was skipped or merged, so a surprising number can be traced."""
    lines = []
    for run in runs:
        lines.append(f"- {run.name}: `{run.path}`")
        lines += [f"  - metrics: `{f}`" for f in run.metric_files]
        lines += [f"  - traces: `{f}`" for f in run.trace_files] or ["  - traces: none"]
        lines.append(f"  - config: `{run.config.file}`" if run.config else "  - config: none")
        lines += [f"  - note: {n}" for n in run.notes]
    return "\n".join(lines) + "\n"
