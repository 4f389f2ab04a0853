"""The simulator section of bench/RESULTS.md: every policy on the report trace seeds, out of sample.

Reproduce: ``.venv/bin/python bench/sim_results.py [--results bench/RESULTS.md]`` (~5-10 minutes on 2 cores; without
``--results`` it only prints). The section goes between the ``sim_results`` markers of the file.

The policies were chosen by ``bench/sim_sweep.py`` on the tuning trace seeds 10-14; this script reports them on
seeds 0-2 only (``REPORT_SEEDS``), which took no part in the choice. Tables: the reference trace at the H100 KV
capacity (the default run, ``python -m recipe.sim``) with every policy; the default policies on each shape at the
H100 and the H200 capacity; the on-policy goal per report seed for best-onpolicy and the tail-cut candidate
tailcut-level; the estimators' prediction quality (issue item 5); priority scheduling, placement and the tail cut
at the H100, H200 and a binding KV capacity (items 3, 4).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from recipe.report.sections import section_main  # noqa: E402
from recipe.sim import __main__ as cli  # noqa: E402
from recipe.sim import trace as T  # noqa: E402
from recipe.sim.engine import KV_TOKENS, EngineParams  # noqa: E402
from recipe.sim.policies import POLICIES, PolicySpec, register  # noqa: E402
from recipe.sim.run import simulate  # noqa: E402
from sim_sweep import SMALL_KV_TOKENS, level_references  # noqa: E402

COMMAND = ".venv/bin/python bench/sim_results.py --results bench/RESULTS.md"
MARK_START, MARK_END = "<!-- sim_results:start -->", "<!-- sim_results:end -->"
SHAPES = ("reference", "heavy_tail", "bimodal")
GPUS = ("h100", "h200")
REPORT_SEEDS = (0, 1, 2)
ALL_POLICIES = ("baseline", "seed", "seed-warm", "calibrated", "best-onpolicy-cold", "onpolicy-order", "best-onpolicy",
                "tailcut", "tailcut-level", "oversample-restart", "best", "best-max-resumes-2",
                "partial-rollout-unbounded", "oracle")
SHAPE_POLICIES = ("seed", "best-onpolicy", "tailcut", "tailcut-level", "best", "oracle")
GOAL_POLICIES = ("best-onpolicy", "tailcut-level")
ESTIMATORS = {"seed's (mean, EMA 0.7), cold": dict(ema_decay=0.7),
              "mean, EMA 0.5, cold": dict(ema_decay=0.5),
              "mean, EMA 0.3, cold": dict(ema_decay=0.3),
              "mean, last epoch only (EMA 0), cold": dict(ema_decay=0.0),
              "median, EMA 0.3, cold": dict(statistic="median", ema_decay=0.3),
              "max, EMA 0.3, cold": dict(statistic="max", ema_decay=0.3),
              "mean, EMA 0.3, warm (earlier run, all epochs)": dict(ema_decay=0.3, warm_start="previous_run"),
              "mean, EMA 0.3, warm (earlier run, first epoch)": dict(ema_decay=0.3, warm_start="previous_run",
                                                                      warm_epochs="first")}


def engine(gpu: str) -> EngineParams:
    return EngineParams(kv_tokens=KV_TOKENS[gpu])


def run(shape: str, seed: int, names, eng: EngineParams) -> dict[str, dict]:
    res = simulate(T.generate(shape, seed=seed), list(names), eng, batch_size=32, seed=seed)
    return {p["name"]: p for p in res["policies"]}


def full_report(shape: str, gpu: str, names) -> dict:
    """What ``python -m recipe.sim --trace shape --gpu gpu --policies names`` reports (seed 0)."""
    args = cli.build_parser().parse_args(["--trace", shape, "--gpu", gpu, "--policies", ",".join(names)])
    trace = cli.load_trace(args)
    eng, _ = cli.engine_params(args)
    res = simulate(trace, list(names), eng, batch_size=args.batch_size, seed=args.seed)
    trace = res["trace"]
    return {"trace": {"name": trace.name, "num_prompts": trace.num_prompts, "n": trace.n, "epochs": trace.epochs,
                      "response_length": trace.response_length, "summary": trace.summary()},
            "engine": eng.to_dict(), "batch_size": args.batch_size, "seed": args.seed,
            "warm_epochs": list(range(1, trace.epochs)), "lower_bound_s": res["lower_bound_s"],
            "policies": res["policies"], "goals": cli.goals(res["policies"])}


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else float("nan")


def shapes_table(results: dict) -> list[str]:
    """results[(shape, gpu)] = [per-seed {policy: entry}] -> mean over report seeds."""
    lines = ["| trace | KV capacity | policy | speedup epochs 1-3 (seeds 0 / 1 / 2) | mean | epoch 0 speedup | extra "
             "truncation (pp) | stale tokens | preemptions per request |", "|---|---|---|---|---|---|---|---|---|"]
    for (shape, gpu), per_seed in results.items():
        base = [r["baseline"]["truncated_fraction"] for r in per_seed]
        for nm in ("baseline", *SHAPE_POLICIES):
            ps = [r[nm] for r in per_seed]
            sp = [p["speedup_vs_baseline"] for p in ps]
            lines.append(f"| {shape} | {gpu} ({KV_TOKENS[gpu] / 1e6:.2f}M tokens) | {nm} | "
                         f"{' / '.join(f'{x:.3f}' for x in sp)} | {np.mean(sp):.3f} | "
                         f"{_mean(p['epoch0_speedup_vs_baseline'] for p in ps):.3f} | "
                         f"{100 * np.mean([p['truncated_fraction'] - b for p, b in zip(ps, base)]):+.2f} | "
                         f"{100 * _mean(p['stale_token_fraction'] for p in ps):.1f}% | "
                         f"{_mean(p['preemptions_per_request'] for p in ps):.4f} |")
    return lines


def onpolicy_goal_table(results: dict) -> list[str]:
    """The on-policy goal per report seed for best-onpolicy and for tailcut-level, the tail-cut candidate."""
    lines = ["| trace | KV capacity | seed | policy | minus the seed's speedup | extra truncation (pp) | the seed's extra "
             "truncation (pp) | epoch 0 speedup | goal met |", "|---|---|---|---|---|---|---|---|---|"]
    for (shape, gpu), per_seed in results.items():
        for name in GOAL_POLICIES:
            for seed, r in zip(REPORT_SEEDS, per_seed):
                g = cli.onpolicy_goal(r, name)
                base = r["baseline"]["truncated_fraction"]
                lines.append(f"| {shape} | {gpu} | {seed} | {name} | {g['speedup_minus_seed']:+.3f} | "
                             f"{100 * g['extra_truncation']:+.2f} | "
                             f"{100 * (r['seed']['truncated_fraction'] - base):+.2f} | {g['epoch0_speedup']:.3f} | "
                             f"{'yes' if g['met'] else 'no'} |")
    return lines


def estimator_table() -> list[str]:
    names = []
    for label, kw in ESTIMATORS.items():
        register(PolicySpec(f"estimator: {label}", **kw))
        names.append(f"estimator: {label}")
    per_seed = [run("reference", seed, names, engine("h100")) for seed in REPORT_SEEDS]
    lines = ["| estimator (no cap) | rank corr. with the epoch's true group maxima, epochs 0 / 1 / 2 / 3 | top-decile "
             "hit, epochs 0 / 1 / 2 / 3 | speedup epochs 1-3 | epoch 0 speedup |", "|---|---|---|---|---|"]

    def per_epoch(ps, key) -> str:
        return " / ".join("-" if np.isnan(v) else f"{v:.3f}"
                          for v in (_mean(p[key][e] for p in ps) for e in range(len(ps[0][key]))))

    for label, nm in zip(ESTIMATORS, names):
        ps = [r[nm] for r in per_seed]
        lines.append(f"| {label} | {per_epoch(ps, 'prediction_rank_corr_per_epoch')} | "
                     f"{per_epoch(ps, 'top_decile_hit_per_epoch')} | "
                     f"{_mean(p['speedup_vs_baseline'] for p in ps):.3f} | "
                     f"{_mean(p['epoch0_speedup_vs_baseline'] for p in ps):.3f} |")
        del POLICIES[nm]
    refs: dict[str, list] = {}
    for seed in REPORT_SEEDS:
        for k, v in level_references(T.generate("reference", seed=seed)).items():
            refs.setdefault(k, []).append(v)
    oracles = [run("reference", seed, ["level-oracle", "oracle"], engine("h100")) for seed in REPORT_SEEDS]
    level = [r["level-oracle"] for r in oracles]
    for k, v in refs.items():
        corr = " / ".join(f"{_mean(q[e]['rank_corr'] for q in v):.3f}" for e in range(len(v[0])))
        rec = " / ".join(f"{_mean(q[e]['top_decile_hit'] for q in v):.3f}" for e in range(len(v[0])))
        speed = "-"
        if k.startswith("true level of the epoch"):
            k, speed = f"{k}: `level-oracle`", f"{_mean(p['speedup_vs_baseline'] for p in level):.3f}"
        lines.append(f"| {k} | - / {corr} | - / {rec} | {speed} | - |")
    lines.append(f"| `oracle` (the epoch's true group maxima) [not realisable] | 1 | 1 | "
                 f"{_mean(r['oracle']['speedup_vs_baseline'] for r in oracles):.3f} | "
                 f"{_mean(r['oracle']['epoch0_speedup_vs_baseline'] for r in oracles):.3f} |")
    return lines


def scheduling_table() -> list[str]:
    """best-onpolicy with priority / placement variants, and tailcut-level with and without priorities; "vs FCFS"
    compares each with the FCFS variant of its own family."""
    base = POLICIES["best-onpolicy"]
    variants = {"longest-first (best-onpolicy)": "best-onpolicy", "FCFS (best-onpolicy-fcfs)": "best-onpolicy-fcfs"}
    for label, kw in (("longest-first + placement by predicted tokens", dict(placement="predicted_tokens")),
                      ("FCFS + placement by predicted tokens", dict(priority="fcfs", placement="predicted_tokens"))):
        register(dataclasses.replace(base, name=f"scheduling: {label}", **kw))
        variants[label] = f"scheduling: {label}"
    register(dataclasses.replace(POLICIES["tailcut-level"], name="scheduling: tailcut-level FCFS", priority="fcfs"))
    variants.update({"tail cut, longest-first (tailcut-level)": "tailcut-level",
                     "tail cut, FCFS": "scheduling: tailcut-level FCFS"})
    fcfs_of = {nm: "scheduling: tailcut-level FCFS" if "tailcut" in nm else "best-onpolicy-fcfs"
               for nm in variants.values()}
    capacities = {f"h100 ({KV_TOKENS['h100'] / 1e6:.2f}M)": KV_TOKENS["h100"],
                  f"h200 ({KV_TOKENS['h200'] / 1e6:.2f}M)": KV_TOKENS["h200"],
                  f"small ({SMALL_KV_TOKENS / 1e6:.2f}M)": SMALL_KV_TOKENS}
    lines = ["| KV capacity per replica | policy | speedup epochs 1-3 (mean over seeds 0-2) | vs FCFS | preemptions per"
             " request | baseline preemptions per request | baseline warm rollout s |", "|---|---|---|---|---|---|---|"]
    for cap_label, kv in capacities.items():
        per_seed = [run("reference", seed, list(variants.values()), EngineParams(kv_tokens=kv))
                    for seed in REPORT_SEEDS]
        for label, nm in variants.items():
            sp = _mean(r[nm]["speedup_vs_baseline"] for r in per_seed)
            fcfs = _mean(r[fcfs_of[nm]]["speedup_vs_baseline"] for r in per_seed)
            lines.append(f"| {cap_label} | {label} | {sp:.3f} | {100 * (sp / fcfs - 1):+.1f}% | "
                         f"{_mean(r[nm]['preemptions_per_request'] for r in per_seed):.4f} | "
                         f"{_mean(r['baseline']['preemptions_per_request'] for r in per_seed):.4f} | "
                         f"{_mean(r['baseline']['rollout_time_s'] for r in per_seed):.0f} |")
    for nm in variants.values():
        if nm.startswith("scheduling: "):
            del POLICIES[nm]
    return lines


def section() -> str:
    lines = [f"Reproduce: `{COMMAND}` (one table: `.venv/bin/python -m recipe.sim --trace <shape> --gpu <h100|h200> "
             "--seed <s>`; the tuning that chose the policies: `.venv/bin/python bench/sim_sweep.py`, on trace seeds "
             "10-14, none of which is reported here).", "",
             f"`best-onpolicy` = {POLICIES['best-onpolicy'].description}.", "",
             f"`tailcut-level` = {POLICIES['tailcut-level'].description}.", "",
             f"`best` = {POLICIES['best'].description}.", "",
             "### `reference`, H100 KV capacity (the default run, trace seed 0)", "",
             cli.markdown(full_report("reference", "h100", ALL_POLICIES)), ""]
    results = {(shape, gpu): [run(shape, seed, SHAPE_POLICIES, engine(gpu)) for seed in REPORT_SEEDS]
               for shape in SHAPES for gpu in GPUS}
    lines += ["### Every shape at the H100 and the H200 capacity (report seeds 0-2, out of sample)", "",
              *shapes_table(results), "",
              "### The on-policy goal per report seed (>= the seed's speedup, <= +1 point truncation, warm-started, "
              "epoch 0 >= 1.1x)",
              "", *onpolicy_goal_table(results), "",
              "### Estimators: prediction quality next to what ordering buys (reference, H100, seeds 0-2)", "",
              *estimator_table(), "",
              "### Priority scheduling, replica placement and the tail cut at three KV capacities (reference, seeds "
              "0-2)", "",
              *scheduling_table()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return section_main(__doc__, section, MARK_START, MARK_END,
                        "## Simulator (bench/sim_results.py)", argv)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
