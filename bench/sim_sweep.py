"""Sweep policy candidates built from recipe.core pieces on *tuning* trace seeds; this is how the simulator's
``best-onpolicy`` and ``best`` were chosen. The seeds the results report (0-2, ``bench/sim_results.py``) take no
part: numbers there are out of sample.

Reproduce: ``.venv/bin/python bench/sim_sweep.py [--trace reference] [--seeds 10,11,12,13,14] [--groups ...]``.
Per group a table of candidates by mean speedup over baseline (epochs 1-3), with the mean and worst extra
truncation over baseline; ``qualifies``: strictly on-policy (one policy version, no stale tokens) and at most
``--max-extra-truncation`` (1 point) more truncation than baseline on every tuning seed. Groups:

* ``onpolicy``: warm start (none, the earlier run's first epoch, all its epochs) x EMA x cap (none, the seed's,
  calibrated, budget at several budgets). ``best-onpolicy`` is the top qualifying one.
* ``tailcut``: best-onpolicy's order with a tail cut (end the step at a fraction of finished responses) and a
  smaller budget (``[needs core]``: recipe/core and the adapter have no tail cut).
* ``estimators``: statistic x EMA without a cap, cold and warm: how well each epoch's estimates rank the epoch's
  true group maxima (Spearman; of the groups predicted in the top decile, the share truly there) next to the
  speedup ordering alone buys. Also two references that are not policies: the true level of the previous epoch
  (the best any estimator can know before the epoch) and of the epoch itself.
* ``engine``: best-onpolicy with FCFS instead of longest-first, and with placement by predicted tokens, at the
  H100, H200 and a small (binding) KV capacity: what priority scheduling and placement buy.
* ``continue``: partial rollout, ratio x max_resumes (``best`` is the top one at max_resumes=1).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import time

import numpy as np

from recipe.sim import trace as T
from recipe.sim.engine import KV_TOKENS, EngineParams
from recipe.sim.policies import (ONPOLICY_BUDGET, ONPOLICY_EMA, POLICIES, SEED_CAP, UNBOUNDED_RESUMES,
                                 PolicySpec, register)
from recipe.sim.run import prediction_quality, simulate

GROUPS = ("onpolicy", "tailcut", "estimators", "engine", "continue")
TUNING_SEEDS = "10,11,12,13,14"
SMALL_KV_TOKENS = 300_000  # per replica: binds in most steps of batch 32 x 16 at the reference lengths
BUDGETS = (0.004, 0.006, 0.007, 0.008, 0.01)
CONTINUE_RATIOS = (0.5, 0.75, 1.0, 1.25, 1.5)
MAX_RESUMES = (1, 2, UNBOUNDED_RESUMES)
_WARM = {"none": {}, "first": dict(warm_start="previous_run", warm_epochs="first"),
         "all": dict(warm_start="previous_run", warm_epochs="all")}


def candidates(group: str) -> list[str]:
    names: list[str] = []

    def add(name: str, **kw) -> None:
        register(PolicySpec(name, **kw))
        names.append(name)

    if group == "onpolicy":
        caps = {"nocap": {}, "seedcap": dict(cap="seed", cap_kwargs=SEED_CAP),
                "calibrated q0.75": dict(cap="calibrated", cap_kwargs={"quantile": 0.75}),
                **{f"budget {b}": dict(cap="budget", cap_kwargs={"budget": b}) for b in BUDGETS}}
        for warm, ema, (cap, kw) in itertools.product(_WARM, (0.3, 0.5, 0.7), caps.items()):
            add(f"warm {warm}/ema{ema}/{cap}", ema_decay=ema, priority="longest_first", **_WARM[warm], **kw)
    elif group == "tailcut":
        for f, b in itertools.product((0.985, 0.99, 0.995), (0.0, 0.004, 0.006)):
            kw = dict(cap="budget", cap_kwargs={"budget": b}) if b else {}
            add(f"warm first/ema{ONPOLICY_EMA}/tailcut {f}/{f'budget {b}' if b else 'nocap'} [needs core]",
                ema_decay=ONPOLICY_EMA, priority="longest_first", tail_cut=f, **_WARM["first"], **kw)
    elif group == "estimators":
        for warm, stat, ema in itertools.product(("none", "first"), ("mean", "median", "p75", "max"),
                                                 (0.7, 0.5, 0.3, 0.0)):
            add(f"warm {warm}/{stat}/ema{ema}/nocap", statistic=stat, ema_decay=ema, **_WARM[warm])
    elif group == "engine":
        base = POLICIES["best-onpolicy"]
        for label, kw in (("fcfs", dict(priority="fcfs")), ("placement", dict(placement="predicted_tokens")),
                          ("fcfs/placement", dict(priority="fcfs", placement="predicted_tokens"))):
            register(dataclasses.replace(base, name=f"best-onpolicy/{label}", **kw))
            names.append(f"best-onpolicy/{label}")
        names.append("best-onpolicy")
    elif group == "continue":
        for ratio, m in itertools.product(CONTINUE_RATIOS, MAX_RESUMES):
            add(tradeoff_name(ratio, m), ema_decay=0.5, oversample_ratio=ratio, oversample_requeue="continue",
                max_resumes=m)
    else:
        raise ValueError(f"unknown group {group!r}; known: {', '.join(GROUPS)}")
    return names


def _resumes_label(m: int) -> str:
    return "inf" if m >= UNBOUNDED_RESUMES else str(m)


def tradeoff_name(ratio: float, m: int) -> str:
    return f"mean/ema0.5/continue {ratio}/max_resumes {_resumes_label(m)}"


def engines(group: str) -> dict[str, EngineParams]:
    if group != "engine":
        return {"h100": EngineParams()}
    return {"h100": EngineParams(), "h200": EngineParams(kv_tokens=KV_TOKENS["h200"]),
            f"kv {SMALL_KV_TOKENS}": EngineParams(kv_tokens=SMALL_KV_TOKENS)}


def level_references(trace: T.Trace) -> dict[str, list[dict]]:
    """Prediction quality of the true log-levels (not realisable): the previous epoch's and the epoch's own."""

    class Known:
        def __init__(self, v):
            self.known, self._v = np.ones(len(v), bool), v

        def filled(self):
            return self._v

    gmax = trace.lengths.max(axis=2)
    return {"true level of the previous epoch [not realisable]":
            [prediction_quality(Known(trace.level[e - 1]), gmax[e]) for e in range(1, trace.epochs)],
            "true level of the epoch [not realisable]":
            [prediction_quality(Known(trace.level[e]), gmax[e]) for e in range(1, trace.epochs)]}


def sweep(trace_name: str, seeds: list[int], group: str, names: list[str]) -> dict[str, dict]:
    """{engine label: {policy: [report entry per seed]}}"""
    out: dict[str, dict] = {}
    for label, eng in engines(group).items():
        per: dict[str, list] = {}
        for seed in seeds:
            trace = T.load(trace_name, **({"seed": seed} if trace_name in T.SHAPES else {}))
            for p in simulate(trace, ["seed", *names], eng, batch_size=32, seed=seed)["policies"]:
                per.setdefault(p["name"], []).append(p)
        out[label] = per
    return out


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def table(per: dict[str, list], max_extra: float, quality: bool = False) -> list[str]:
    base = [p["truncated_fraction"] for p in per["baseline"]]
    rows = []
    for name, ps in per.items():
        extra = [p["truncated_fraction"] - b for p, b in zip(ps, base)]
        onpolicy = all(p["max_policy_versions"] == 1 and p["stale_token_fraction"] == 0 for p in ps)
        ok = onpolicy and max(extra) <= max_extra + 1e-12
        cells = [f"{'yes' if ok else 'no'}", f"{_mean(p['speedup_vs_baseline'] for p in ps):.3f}",
                 f"{_mean(p['epoch0_speedup_vs_baseline'] for p in ps):.3f}",
                 f"{100 * np.mean(extra):+.2f} / {100 * max(extra):+.2f}",
                 f"{_mean(p['preemptions_per_request'] for p in ps):.4f}"]
        if quality:
            cells += [f"{_mean(q for p in ps for q in p['prediction_rank_corr_per_epoch'][1:]):.3f}",
                      f"{_mean(q for p in ps for q in p['top_decile_hit_per_epoch'][1:]):.3f}",
                      f"{_mean(p['prediction_rank_corr_per_epoch'][0] for p in ps):.3f}"]
        rows.append((not ok, -_mean(p["speedup_vs_baseline"] for p in ps), name, cells))
    head = ("| policy | qualifies | speedup (epochs 1-3) | epoch 0 speedup | extra truncation mean / worst (pp) "
            "| preemptions per request |")
    if quality:
        head += " rank corr. (epochs 1-3) | top-decile hit (epochs 1-3) | rank corr. epoch 0 |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for _, _, name, cells in sorted(rows):
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="reference")
    ap.add_argument("--seeds", default=TUNING_SEEDS, help="tuning trace seeds (keep them apart from reported ones)")
    ap.add_argument("--groups", default="onpolicy,tailcut,estimators,engine,continue",
                    help=f"comma list of {', '.join(GROUPS)}")
    ap.add_argument("--max-extra-truncation", type=float, default=0.01)
    args = ap.parse_args()
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    if unknown := set(groups) - set(GROUPS):
        raise SystemExit(f"unknown groups {sorted(unknown)}; known: {', '.join(GROUPS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.perf_counter()
    print(f"trace={args.trace} tuning seeds={seeds}; ONPOLICY_BUDGET={ONPOLICY_BUDGET} ONPOLICY_EMA={ONPOLICY_EMA}")
    for group in groups:
        names = candidates(group)
        for label, per in sweep(args.trace, seeds, group, names).items():
            print(f"\n### {group} ({label})\n")
            print("\n".join(table(per, args.max_extra_truncation, quality=group == "estimators")))
        if group == "estimators" and args.trace in T.SHAPES:
            refs: dict[str, list] = {}
            for seed in seeds:
                for k, v in level_references(T.generate(args.trace, seed=seed)).items():
                    refs.setdefault(k, []).extend(v)
            for k, v in refs.items():
                print(f"| {k} | - | - | - | - | - | {_mean(q['rank_corr'] for q in v):.3f} | "
                      f"{_mean(q['top_decile_hit'] for q in v):.3f} | - |")
    print(f"\n# {time.perf_counter() - t0:.0f} s; reproduce: .venv/bin/python bench/sim_sweep.py --seeds {args.seeds}"
          f" --groups {','.join(groups)}")


if __name__ == "__main__":
    main()
