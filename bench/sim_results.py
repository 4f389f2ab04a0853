"""The simulator part of bench/RESULTS.md: the policy tables on the three trace shapes, the ranking, how ``best``
compares with ``seed`` per trace seed, and the ratio x max_resumes trade-off behind ``best``.

Reproduce: ``.venv/bin/python bench/sim_results.py [--results bench/RESULTS.md]`` (~1 minute; without
``--results`` it only prints). The section goes between the ``sim_results`` markers of the file.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from recipe.report.sections import write_section  # noqa: E402
from recipe.sim import __main__ as cli  # noqa: E402
from recipe.sim import trace as T  # noqa: E402
from recipe.sim.engine import EngineParams  # noqa: E402
from recipe.sim.policies import POLICIES  # noqa: E402
from recipe.sim.run import simulate  # noqa: E402
from sim_sweep import tradeoff, tradeoff_candidates  # noqa: E402

COMMAND = ".venv/bin/python bench/sim_results.py --results bench/RESULTS.md"
MARK_START, MARK_END = "<!-- sim_results:start -->", "<!-- sim_results:end -->"
SHAPES = ("reference", "heavy_tail", "bimodal")
SEEDS = (0, 1, 2)


def report_for(shape: str) -> dict:
    args = cli.build_parser().parse_args(["--trace", shape])
    trace = cli.load_trace(args)
    engine, _ = cli.engine_params(args)
    names = cli.DEFAULT_POLICIES.split(",")
    res = simulate(trace, names, engine, batch_size=args.batch_size, seed=args.seed)
    trace = res["trace"]
    return {"trace": {"name": trace.name, "num_prompts": trace.num_prompts, "n": trace.n, "epochs": trace.epochs,
                      "response_length": trace.response_length, "summary": trace.summary()},
            "engine": engine.to_dict(), "batch_size": args.batch_size, "seed": args.seed,
            "warm_epochs": list(range(1, trace.epochs)), "lower_bound_s": res["lower_bound_s"],
            "policies": res["policies"], "goals": cli.goals(res["policies"])}


def per_seed_margins() -> list[str]:
    out = ["| trace | seed | best - seed speedup | best truncated | seed truncated | baseline truncated "
           "| best stale tokens | best max versions |", "|---|---|---|---|---|---|---|---|"]
    for shape in SHAPES:
        for seed in SEEDS:
            res = simulate(T.generate(shape, seed=seed), ["seed", "best"], EngineParams(), batch_size=32, seed=seed)
            by = {p["name"]: p for p in res["policies"]}
            b, s, base = by["best"], by["seed"], by["baseline"]
            out.append(f"| {shape} | {seed} | {b['speedup_vs_baseline'] - s['speedup_vs_baseline']:+.3f} | "
                       f"{100 * b['truncated_fraction']:.2f}% | {100 * s['truncated_fraction']:.2f}% | "
                       f"{100 * base['truncated_fraction']:.2f}% | {100 * b['stale_token_fraction']:.1f}% | "
                       f"{b['max_policy_versions']} |")
    return out


def tradeoff_table() -> str:
    names = tradeoff_candidates()
    per_seed = []
    for seed in SEEDS:
        res = simulate(T.generate("reference", seed=seed), names, EngineParams(), batch_size=32, seed=seed)
        per_seed.append({p["name"]: p for p in res["policies"]})
    return tradeoff(per_seed)


def section() -> str:
    lines = [f"Reproduce: `{COMMAND}` (tables: `.venv/bin/python -m recipe.sim --trace <shape>`; full sweep: "
             "`.venv/bin/python bench/sim_sweep.py --tradeoff`).", "",
             f"`best` = {POLICIES['best'].description}.", ""]
    for shape in SHAPES:
        rep = report_for(shape)
        ranked = sorted(rep["policies"], key=lambda p: -p["speedup_vs_baseline"])
        lines += [f"### `{shape}`", "", cli.markdown(rep), "",
                  "Ranking by speedup: " + " > ".join(f"{p['name']} {p['speedup_vs_baseline']:.3f}" for p in ranked),
                  ""]
    lines += ["### best vs seed per trace seed", "", *per_seed_margins(), "",
              "### Trade-off behind `best` (reference trace, seeds 0-2)", "", tradeoff_table()]
    return "\n".join(lines)


def write(path: Path, text: str) -> None:
    write_section(path, MARK_START, MARK_END, "## Simulator (bench/sim_results.py)", text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", metavar="PATH", help="write the section into this markdown file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    text = section()
    print(text)
    if args.results:
        write(Path(args.results), text)
    print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
