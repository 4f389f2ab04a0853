"""``python -m recipe.sim.speed_table``: the README's speed table, every row from one ``python -m recipe.sim``
command (printed beside it) and named by its workload and acceptance source.

Rows without speculation need no acceptance: their workload is the simulator's trace (lengths only). Rows with a
drafter read its acceptance from a file in ``recipe/sim/curves`` (what was measured where, and what is not in this
repository, is in each file's ``source``); nothing is a constant in this script. The group drafter is charged 1 us of
CPU per emitted token (``bench/group_drafter_cost.py``: 0.7-1.0 us in the corpus, issue 43: up to 1.46 us through
``GroupProposer.propose``), its router's homes, guard and splits (``recipe/sim/routing.py``) and, with history, the
share of responses that find it (``recipe/sim/corpus_limits.py``: the texts an engine keeps, by count and by bytes,
``--corpus-gib``; at the trace's 1,024 prompts every bound holds an epoch, ``--prompts 17408`` is the users' scale).
Figures: speed-up over ``baseline`` (verl's random
order), epochs 1-3, mean of trace seeds 0-2 (``--seed 0``, ``1``, ``2``), H100 (the simulator's defaults).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..drafting.bounds import CORPUS_GIB, DEFAULT_CORPUS_GIB
from .__main__ import build_parser, run_report

CODE, MATH = "recipe/sim/curves/code-humaneval-codet.json", "recipe/sim/curves/math-heldout-issue43.json"
GROUP_CPU = ("--spec-draft-s-per-context-token", "0", "--spec-draft-s-per-new-token", "1e-6")
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Row:
    feature: str
    policy: str
    workload: str
    args: tuple = ()

    def argv(self, seed: int, extra: tuple = ()) -> list[str]:
        return ["--json", "--policies", self.policy, *self.args, *extra, "--seed", str(seed)]

    def command(self, extra: tuple = ()) -> str:
        return " ".join([".venv/bin/python -m recipe.sim --policies", self.policy, *self.args, *extra,
                         "--seed {0,1,2}"])


def curve(path: str, drafter: str) -> tuple:
    return ("--acceptance-curve", path, "--drafter", drafter)


TRACE = "reference trace (Qwen3-30B-A3B-like lengths at 16k); no drafting"
ROWS = (
    Row("length-aware order alone (warm-started, longest-first, no cap)", "onpolicy-order", TRACE),
    Row("order + per-batch cap (the seed)", "seed", TRACE),
    Row("on-policy tail cut (warm-started order, no cap, longest-first)", "tailcut-level", TRACE),
    Row("over-sample, `continue` (partial rollout, off-policy)", "best", TRACE),
    Row("tail cut at a 0.8-point budget, no speculation", "tailcut-budget-spec-off", TRACE),
    Row("+ `ngram` 1-3", "best-onpolicy-spec", "code, own context",
        curve(CODE, "ngram:k=4:min=1:max=3")),
    Row("+ `group` drafter, no history (a first epoch, or after a restart)", "best-onpolicy-spec",
        "code, own + group, no history", curve(CODE, "suffix:own+group:k=4:depth=8:min=1") + GROUP_CPU),
    Row("+ `group` drafter, later epochs (the history the router and corpus keep)", "best-onpolicy-spec",
        "code, own + group + history", curve(CODE, "suffix:own+group+history:k=4:depth=8:min=1") + GROUP_CPU),
    Row("+ `group` drafter on math, no history (set 1)", "best-onpolicy-spec", "math, own + group, no history",
        curve(MATH, "suffix:own+group:k=4:depth=8:min=1:set=1") + GROUP_CPU),
    Row("+ `group` drafter on math, no history (set 2)", "best-onpolicy-spec", "math, own + group, no history",
        curve(MATH, "suffix:own+group:k=4:depth=8:min=1:set=2") + GROUP_CPU),
)


def measure(row: Row, seeds=SEEDS, extra: tuple = ()) -> dict:
    """The row's policy over ``seeds``: speed-up, extra truncation over baseline (points), epoch 0, acceptance."""
    runs = []
    for seed in seeds:
        report = run_report(build_parser().parse_args(row.argv(seed, extra)))
        by = {p["name"]: p for p in report["policies"]}
        runs.append((by[row.policy], by["baseline"], report["speculation"]))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    sp = runs[0][2]
    return {"speedups": [p["speedup_vs_baseline"] for p, _, _ in runs],
            "speedup": mean([p["speedup_vs_baseline"] for p, _, _ in runs]),
            "extra_truncation": mean([100 * (p["truncated_fraction"] - b["truncated_fraction"]) for p, b, _ in runs]),
            "epoch0": mean([p["epoch0_speedup_vs_baseline"] for p, _, _ in runs]),
            "acceptance": sp["acceptance_length_source"] if "--acceptance-curve" in row.args else None,
            "tokens_per_step": None if sp["curve"] is None else sp["curve"]["tau"]}


def table(rows=ROWS, seeds=SEEDS, extra: tuple = ()) -> list[str]:
    lines = ["| feature | speed-up (per seed) | extra truncation | epoch 0 | workload | acceptance (tokens per step: "
             "source) | command |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        m = measure(row, seeds, extra)
        acc = "-" if m["acceptance"] is None else f"{m['tokens_per_step'][0]:.3f}: {m['acceptance']}"
        lines.append(f"| {row.feature} | **{m['speedup']:.2f}x** ({' / '.join(f'{x:.3f}' for x in m['speedups'])}) "
                     f"| {m['extra_truncation']:+.2f} points | {m['epoch0']:.2f}x | {row.workload} | {acc} | "
                     f"`{row.command(extra)}` |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.sim.speed_table", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--prompts", type=int, help="the trace's prompts (default: its 1024; the users' scale: 17408)")
    ap.add_argument("--corpus-gib", type=float, help=f"{CORPUS_GIB} per engine (default {DEFAULT_CORPUS_GIB:g})")
    args = ap.parse_args(argv)
    extra = (*(("--prompts", str(args.prompts)) if args.prompts else ()),
             *(("--corpus-gib", f"{args.corpus_gib:g}") if args.corpus_gib is not None else ()))
    print("\n".join(table(seeds=args.seeds, extra=extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
