"""Sweep policy candidates built from recipe.core pieces; this is how the simulator's ``best`` and ``best-onpolicy``
policies were chosen.

Reproduce: ``.venv/bin/python bench/sim_sweep.py [--trace reference] [--seeds 0,1,2] [--groups onpolicy,restart,
continue]``. A candidate qualifies when it truncates no more than ``seed`` on every trace seed; qualified candidates
are listed by their mean speedup over baseline (epochs after the first), then the others. Groups:

* ``onpolicy``: order (statistic, EMA) x cap (none, calibrated, seed formula; batch or per-row scope) and tail cuts
  (``[needs core]``: recipe/core has no tail-cut piece). This is where ``best-onpolicy`` comes from.
* ``restart``: over-sample ratio x order with ``restart`` (aborted groups start afresh at the back of the epoch).
* ``continue``: partial rollout, ratio x ``max_resumes`` x cap. The controller puts aborted groups at the front and
  keeps their partial responses while they have been resumed fewer than ``max_resumes`` times, else restarts them;
  the stale columns say how off-policy the trained data is. This is where ``best`` comes from; ``--tradeoff`` prints
  the ratio x max_resumes pivot of speedup / max versions / stale-token fraction (no cap).
"""
from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from recipe.sim import trace as T
from recipe.sim.engine import EngineParams
from recipe.sim.policies import ONPOLICY_CAP, UNBOUNDED_RESUMES, PolicySpec, register
from recipe.sim.run import simulate

GROUPS = ("onpolicy", "restart", "continue")
CONTINUE_RATIOS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
MAX_RESUMES = (0, 1, 2, 3, UNBOUNDED_RESUMES)


def _resumes_label(m: int) -> str:
    return "inf" if m >= UNBOUNDED_RESUMES else str(m)


def candidates(groups=GROUPS) -> list[str]:
    names = []

    def add(name: str, **kw) -> None:
        register(PolicySpec(name, **kw))
        names.append(name)

    if "onpolicy" in groups:
        for stat, ema in itertools.product(("mean", "p75", "p90", "max"), (0.5, 0.7)):
            base = dict(order="plan", statistic=stat, ema_decay=ema)
            add(f"{stat}/ema{ema}/nocap", **base)
            for scope in ("batch", "row"):
                for q in (0.75, 0.8, 0.85, 0.9, 0.95):
                    add(f"{stat}/ema{ema}/calibrated q={q}/{scope}", **base, cap="calibrated",
                        cap_kwargs={"quantile": q}, cap_scope=scope)
                for f, m in ((1.5, 8192), (2.0, 8192), (2.0, 10000), (2.5, 8192)):
                    add(f"{stat}/ema{ema}/seedcap {f}x>={m}/{scope}", **base, cap="seed",
                        cap_kwargs={"factor": f, "min_tokens": m}, cap_scope=scope)
        add("mean/ema0.7/bucket256/calibrated q=0.8/batch", statistic="mean", bucket_size=256, cap="calibrated",
            cap_kwargs={"quantile": 0.8})
        for bucket in (512, 1024, 2048):
            add(f"mean/ema0.5/shuffled in bucket {bucket}/calibrated q=0.75/batch", ema_decay=0.5, bucket_size=bucket,
                within_bucket="shuffled", cap="calibrated", cap_kwargs={"quantile": 0.75})
        for f in (0.97, 0.98, 0.99):
            add(f"mean/ema0.7/tailcut {f} [needs core]", tail_cut=f)
            add(f"mean/ema0.7/tailcut {f}+calibrated q=0.95 [needs core]", tail_cut=f, cap="calibrated")
    if "restart" in groups:
        for ratio in (0.125, 0.25, 0.5, 1.0):
            add(f"mean/ema0.5/oversample {ratio}/restart", ema_decay=0.5, oversample_ratio=ratio)
            add(f"random/oversample {ratio}/restart", order="random", oversample_ratio=ratio)
    if "continue" in groups:
        for ratio, m in itertools.product(CONTINUE_RATIOS, MAX_RESUMES):
            kw = dict(ema_decay=0.5, oversample_ratio=ratio, oversample_requeue="continue", max_resumes=m)
            add(tradeoff_name(ratio, m), **kw)
            if m <= 2:
                q = ONPOLICY_CAP["quantile"]
                add(f"{tradeoff_name(ratio, m)}/calibrated q={q}", **kw, cap="calibrated", cap_kwargs=ONPOLICY_CAP)
                add(f"{tradeoff_name(ratio, m)}/seedcap", **kw, cap="seed",
                    cap_kwargs={"factor": 2.0, "min_tokens": 10000})
        for bucket in (512, 1024, 2048):
            add(f"mean/ema0.5/shuffled in bucket {bucket}/continue 1.0/max_resumes 1", ema_decay=0.5,
                bucket_size=bucket, within_bucket="shuffled", oversample_ratio=1.0, oversample_requeue="continue")
        for ratio in (0.5, 1.0):
            add(f"random/continue {ratio}/max_resumes 1", order="random", oversample_ratio=ratio,
                oversample_requeue="continue", max_resumes=1)
    return names


def tradeoff_name(ratio: float, m: int) -> str:
    return f"mean/ema0.5/continue {ratio}/max_resumes {_resumes_label(m)}"


def tradeoff_candidates() -> list[str]:
    """Only the ratio x max_resumes pivot (continue, no cap)."""
    names = []
    for ratio, m in itertools.product(CONTINUE_RATIOS, MAX_RESUMES):
        register(PolicySpec(tradeoff_name(ratio, m), ema_decay=0.5, oversample_ratio=ratio,
                            oversample_requeue="continue", max_resumes=m))
        names.append(tradeoff_name(ratio, m))
    return names


def tradeoff(per_seed: list[dict]) -> str:
    """ratio x max_resumes (no cap): mean speedup, max policy versions, stale-token fraction, wasted fraction."""
    out = ["ratio x max_resumes (continue, no cap; mean over seeds): speedup / max versions / stale tokens / "
           "resumed responses / wasted tokens / truncated",
           "| ratio | " + " | ".join(f"max_resumes={_resumes_label(m)}" for m in MAX_RESUMES) + " |",
           "|---|" + "---|" * len(MAX_RESUMES)]
    for ratio in CONTINUE_RATIOS:
        cells = []
        for m in MAX_RESUMES:
            rs = [r[tradeoff_name(ratio, m)] for r in per_seed]
            cells.append(f"{np.mean([r['speedup_vs_baseline'] for r in rs]):.3f} / "
                         f"{max(r['max_policy_versions'] for r in rs)} / "
                         f"{100 * np.mean([r['stale_token_fraction'] for r in rs]):.1f}% / "
                         f"{100 * np.mean([r['resumed_response_fraction'] for r in rs]):.0f}% / "
                         f"{100 * np.mean([r['wasted_tokens_fraction'] for r in rs]):.1f}% / "
                         f"{100 * np.mean([r['truncated_fraction'] for r in rs]):.2f}%")
        out.append(f"| {ratio} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="reference")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"comma list of {', '.join(GROUPS)}")
    ap.add_argument("--tradeoff", action="store_true", help="also print the ratio x max_resumes pivot (continue)")
    ap.add_argument("--top", type=int, default=0, help="print only the first N rows of the ranking (0: all)")
    args = ap.parse_args()
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    if unknown := set(groups) - set(GROUPS):
        raise SystemExit(f"unknown groups {sorted(unknown)}; known: {', '.join(GROUPS)}")
    t0 = time.perf_counter()
    names = ["seed", "best", "best-onpolicy", "oracle", *candidates(groups)]
    seeds = [int(s) for s in args.seeds.split(",")]
    per_seed = []
    for seed in seeds:
        trace = T.load(args.trace, **({"seed": seed} if args.trace in T.SHAPES else {}))
        res = simulate(trace, names, EngineParams(), batch_size=32, seed=seed)
        per_seed.append({p["name"]: p for p in res["policies"]})
    rows = []
    for name in ["baseline", *names]:
        rs = [r[name] for r in per_seed]
        ok = all(p["truncated_fraction"] <= r["seed"]["truncated_fraction"] for p, r in zip(rs, per_seed))
        rows.append((ok, float(np.mean([p["speedup_vs_baseline"] for p in rs])),
                     float(np.mean([p["truncated_fraction"] for p in rs])),
                     max(p["max_policy_versions"] for p in rs),
                     float(np.mean([p["stale_token_fraction"] for p in rs])),
                     float(np.mean([p["wasted_tokens_fraction"] for p in rs])), name))
    print(f"trace={args.trace} seeds={seeds} groups={groups}; seed truncates "
          f"{np.mean([r['seed']['truncated_fraction'] for r in per_seed]):.4f}, baseline "
          f"{np.mean([r['baseline']['truncated_fraction'] for r in per_seed]):.4f}")
    print("qualifies  speedup  truncated  versions  stale tokens  wasted  policy")
    ranked = sorted(rows, key=lambda r: (not r[0], -r[1]))
    for ok, speed, trunc, versions, stale, wasted, name in ranked[: args.top or None]:
        print(f"{'yes' if ok else 'no ':9s}  {speed:7.3f}  {trunc:9.4f}  {versions:8d}  {stale:12.4f}  {wasted:6.3f}"
              f"  {name}")
    if args.tradeoff and "continue" in groups:
        print()
        print(tradeoff(per_seed))
    print(f"# {len(names) + 1} policies x {len(seeds)} seeds in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
