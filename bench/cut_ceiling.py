"""How far a tail cut could take the on-policy goal: the foresight cut (``recipe.sim.foresight``, not realisable)
next to the seed and ``tailcut-level``'s count rule, trace seed by trace seed.

Reproduce: ``.venv/bin/python bench/cut_ceiling.py [--trace reference] [--seeds 0,1,2] [--results
bench/RESULTS.md]`` (~1.5 minutes for three seeds on 2 cores; without ``--results`` it only prints).

Per seed: ``baseline``, ``seed`` and ``tailcut-level`` as ``python -m recipe.sim`` runs them; then
``tailcut-level`` with its cut replaced by the foresight cut, its ``lam`` searched on that very seed (bisection in
log space) for the fastest run within an extra-truncation budget:

* tailcut-level's own extra truncation on that seed (equal truncation: what the count rule leaves on the table),
  once charging every response the cut stops (foresight of timing alone) and once charging only those that would
  have ended with EOS (the full foresight: it also knows which stragglers are bound for the limit anyway);
* the goal's +1 point: the most any cut can give on this order within the goal;
* the same +1-point search on the ``level-oracle`` order (each prompt's true level in the epoch): a perfect
  estimate of every prompt and a perfect cut together.

Then where the gain at equal truncation lies, by batch level (``batch_level``): the equal-truncation foresight run
again, recording at each step of epochs 1-3 what its cut and the count rule's (the policy's own rule on the same
step) leave running, how many of those would have ended with EOS, how many ``recipe.sim.limit_bound``'s posterior
expects to (what a realisable rule could know, on the trace's own model), and the time each cut saves.

Fitting ``lam`` on the reported seed is right for a ceiling and wrong for a policy: none of the foresight columns
is a policy anyone can run.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.report.sections import write_section  # noqa: E402
from recipe.sim import trace as T  # noqa: E402
from recipe.sim.__main__ import MOONSHOT_EXTRA_TRUNCATION  # noqa: E402
from recipe.sim.engine import EngineParams  # noqa: E402
from recipe.sim.foresight import ForesightCutExecutor, ends_with_eos  # noqa: E402
from recipe.sim.limit_bound import expected_natural  # noqa: E402
from recipe.sim.policies import POLICIES, PolicySpec, register  # noqa: E402
from recipe.sim.run import ModelExecutor, run_policy, summarize  # noqa: E402

COMMAND = ".venv/bin/python bench/cut_ceiling.py --results bench/RESULTS.md"
MARK_START, MARK_END = "<!-- cut_ceiling:start -->", "<!-- cut_ceiling:end -->"
CUT_POLICY = "tailcut-level"
NOCUT_POLICY = "onpolicy-order"  # tailcut-level's order without the cut
LEVEL_CUT_POLICY = "level-oracle + cut"  # the level order with a cut to replace (its count rule is never used)
LAM_RANGE = (0.01, 1000.0)  # seconds per extra truncated response; at the top no step is worth cutting
BISECTIONS = 12
BATCH_SIZE = 32
LEVEL_EDGES = (0.85, 1.15, 1.6)  # batch-level bins of the breakdown
CUTS = ("count", "foresight")


class CutRecorder(ForesightCutExecutor):
    """The foresight cut that also records, per step of epochs >= 1, what it and the count rule would stop there:
    ``(running, natural, expected natural, time saved)`` per cut, and the batch level."""

    def __init__(self, engine, seed: int, *, lam: float, within_sigma: float, prior_sd: float):
        super().__init__(engine, seed, lam=lam)
        self.within_sigma, self.prior_sd = within_sigma, prior_sd
        self.steps: list[dict] = []

    def cut_time(self, policy, plan, launch, finish, kept) -> float:
        t_foresight = super().cut_time(policy, plan, launch, finish, kept)
        if policy.epoch >= 1:
            f, length, natural = finish[kept], launch.target[kept], ends_with_eos(policy, plan, launch)[kept]
            step = {"level": plan.cut_level}
            count = ModelExecutor.cut_time(self, policy, plan, launch, finish, kept)  # the policy's own rule
            for cut, t in zip(CUTS, (count, t_foresight)):
                expected = expected_natural(f, length, plan.predicted[kept], t, response_length=policy.response_length,
                                            within_sigma=self.within_sigma, prior_sd=self.prior_sd)
                step[cut] = (int((f > t).sum()), int(((f > t) & natural).sum()), expected, float(f.max() - t))
            self.steps.append(step)
        return t_foresight


class Seeded:
    """The runs of one trace seed, sharing the trace, the earlier run and the baseline."""

    def __init__(self, trace_name: str, seed: int, batch_size: int = BATCH_SIZE, **trace_params):
        self.seed, self.batch_size = seed, batch_size
        self.trace = T.generate(trace_name, seed=seed, **trace_params)
        self.previous = self.trace.previous_run()
        self.engine = EngineParams()
        self.baseline = self._run("baseline")
        self.base_trunc = summarize(self.baseline, self.trace.epochs, self.trace.num_prompts)["truncated_fraction"]

    def _run(self, name: str, lam: float | None = None, limit_bound_free: bool = True):
        executor = (None if lam is None else
                    ForesightCutExecutor(self.engine, self.seed, lam=lam, limit_bound_free=limit_bound_free))
        return run_policy(self.trace, name, self.engine, batch_size=self.batch_size, seed=self.seed,
                          previous=self.previous, executor=executor)

    def entry(self, name: str, lam: float | None = None, limit_bound_free: bool = True) -> dict:
        """``speedup`` over epochs 1-3 and ``extra`` truncation over the baseline (a fraction)."""
        e = summarize(self._run(name, lam, limit_bound_free), self.trace.epochs, self.trace.num_prompts,
                      self.baseline)
        return {"speedup": e["speedup_vs_baseline"], "extra": e["truncated_fraction"] - self.base_trunc, "lam": lam}

    def breakdown(self, lam: float) -> list[dict]:
        """``CutRecorder``'s steps for the foresight cut at ``lam``; the posterior gets the trace's within-group
        spread and, as its prior's spread, one epoch of random walk plus the noise of a group's mean."""
        p = self.trace.params
        recorder = CutRecorder(self.engine, self.seed, lam=lam, within_sigma=p["within_sigma"],
                               prior_sd=math.hypot(p["epoch_sigma"], p["within_sigma"] / math.sqrt(self.trace.n)))
        run_policy(self.trace, CUT_POLICY, self.engine, batch_size=self.batch_size, seed=self.seed,
                   previous=self.previous, executor=recorder)
        return recorder.steps

    def fastest_within(self, name: str, budget: float, limit_bound_free: bool = True) -> dict:
        """The foresight cut's fastest run at most ``budget`` extra truncation: the smallest ``lam`` that keeps to
        it (extra truncation falls as ``lam`` grows; at the top of ``LAM_RANGE`` nothing natural is cut)."""
        lo, hi = (math.log(x) for x in LAM_RANGE)
        best = self.entry(name, math.exp(hi), limit_bound_free)
        if best["extra"] > budget + 1e-12:
            raise RuntimeError(f"{name}: even lam={LAM_RANGE[1]} truncates {best['extra']:+.4f} > {budget}")
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            e = self.entry(name, math.exp(mid), limit_bound_free)
            if e["extra"] <= budget + 1e-12:
                hi = mid
                best = max(best, e, key=lambda x: x["speedup"])
            else:
                lo = mid
        return best


def register_level_cut() -> None:
    """The level-oracle order as a tail-cut policy, so that the foresight executor has a cut to replace."""
    if LEVEL_CUT_POLICY not in POLICIES:
        spec = POLICIES[CUT_POLICY]
        register(PolicySpec(LEVEL_CUT_POLICY, "the level-oracle order with a cut (not realisable)", order="level",
                            tail_cut=spec.tail_cut, tail_cut_exponent=spec.tail_cut_exponent))


def measure(trace_name: str, seeds: list[int], **kw) -> list[dict]:
    """One row per seed (``kw``: ``Seeded``'s batch size and trace parameters, for a smaller trace)."""
    register_level_cut()
    try:
        return [_measure_seed(trace_name, seed, **kw) for seed in seeds]
    finally:
        POLICIES.pop(LEVEL_CUT_POLICY, None)  # the registry is the simulator's, shared with whoever imported it


def _measure_seed(trace_name: str, seed: int, **kw) -> dict:
    t0 = time.perf_counter()
    s = Seeded(trace_name, seed, **kw)
    row = {"seed": seed, "seed_policy": s.entry("seed"), "count_rule": s.entry(CUT_POLICY),
           "nocut": s.entry(NOCUT_POLICY)["speedup"]}
    row["timing_equal"] = s.fastest_within(CUT_POLICY, row["count_rule"]["extra"], limit_bound_free=False)
    row["foresight_equal"] = s.fastest_within(CUT_POLICY, row["count_rule"]["extra"])
    row["steps"] = s.breakdown(row["foresight_equal"]["lam"])
    row["foresight_goal"] = s.fastest_within(CUT_POLICY, MOONSHOT_EXTRA_TRUNCATION)
    row["level_foresight_goal"] = s.fastest_within(LEVEL_CUT_POLICY, MOONSHOT_EXTRA_TRUNCATION)
    print(f"# trace seed {seed}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return row


COLUMNS = (("seed_policy", "seed"), ("count_rule", f"{CUT_POLICY} (count rule)"),
           ("timing_equal", "foresight of timing only, same truncation"),
           ("foresight_equal", "foresight cut, same truncation"), ("foresight_goal", "foresight cut, <= +1 point"),
           ("level_foresight_goal", "level-oracle order + foresight cut, <= +1 point"))


def _cell(e: dict) -> str:
    return f"{e['speedup']:.4f} ({100 * e['extra']:+.2f})"


def table(rows: list[dict]) -> list[str]:
    lines = ["| trace seed | " + " | ".join(label for _, label in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r['seed']} | " + " | ".join(_cell(r[key]) for key, _ in COLUMNS) + " |")
    mean = {key: {"speedup": float(np.mean([r[key]["speedup"] for r in rows])),
                  "extra": float(np.mean([r[key]["extra"] for r in rows]))} for key, _ in COLUMNS}
    lines.append("| mean | " + " | ".join(_cell(mean[key]) for key, _ in COLUMNS) + " |")
    return lines


def verdict(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        seed, goal = r["seed_policy"]["speedup"], r["foresight_goal"]["speedup"]
        out.append(f"- trace seed {r['seed']}: the best cut on this order within the goal is {goal:.4f}, the seed "
                   f"{seed:.4f} ({100 * (goal / seed - 1):+.2f}%). At the count rule's truncation, foresight adds "
                   f"{100 * (r['foresight_equal']['speedup'] / r['count_rule']['speedup'] - 1):+.2f}% to it (timing "
                   f"alone {100 * (r['timing_equal']['speedup'] / r['count_rule']['speedup'] - 1):+.2f}%); the "
                   f"count rule has {_share(r):.0f}% of the foresight cut's gain over the uncut order.")
    return out


def level_table(rows: list[dict]) -> list[str]:
    """The equal-truncation breakdown over every seed's steps, by batch level; per cut: count rule / foresight."""
    steps = [st for r in rows for st in r["steps"]]
    level = np.array([st["level"] for st in steps])
    edges = (0.0, *LEVEL_EDGES, math.inf)
    lines = ["| batch level | steps | responses running at the cut | of them bound for EOS (extra truncation) | "
             "... that the posterior expects | time saved per step (s) |", "|---" * 6 + "|"]
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = [st for st, lv in zip(steps, level) if lo <= lv < hi]
        if not sel:
            continue
        mean = {cut: np.mean([st[cut] for st in sel], axis=0) for cut in CUTS}
        cells = [" / ".join(fmt.format(mean[cut][i]) for cut in CUTS)
                 for i, fmt in enumerate(("{:.1f}", "{:.2f}", "{:.2f}", "{:.1f}"))]
        name = f"< {hi:g}" if lo == 0 else (f">= {lo:g}" if hi == math.inf else f"{lo:g}-{hi:g}")
        lines.append(f"| {name} | {len(sel)} | " + " | ".join(cells) + " |")
    return lines


def _share(r: dict) -> float:
    """The count rule's gain over the uncut order as a share of the foresight cut's at the same truncation."""
    gain = r["foresight_equal"]["speedup"] - r["nocut"]
    return 100 * (r["count_rule"]["speedup"] - r["nocut"]) / gain if gain > 0 else float("nan")


def section(trace_name: str, seeds: list[int], rows: list[dict]) -> str:
    return "\n".join([
        f"Reproduce: `{COMMAND}` (trace `{trace_name}`, seeds {', '.join(map(str, seeds))}). Speedup over baseline "
        "on epochs 1-3, extra truncation over baseline in points in brackets. The foresight columns are not "
        "policies: each knows every response's finish time and has its `lam` fitted on the seed it reports "
        "(`recipe/sim/foresight.py`).", "", *table(rows), "", *verdict(rows), "",
        "Where the gain at equal truncation lies (all seeds' steps of epochs 1-3 by batch level; each cell: the count "
        "rule / the foresight cut on the same step; the posterior is `recipe/sim/limit_bound.py`'s, on the trace's own "
        "model, knowing what had finished by the cut):", "", *level_table(rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="reference", choices=sorted(T.SHAPES))
    ap.add_argument("--seeds", default="0,1,2", help="comma list of trace seeds")
    ap.add_argument("--results", metavar="PATH", help="write the section into this markdown file")
    args = ap.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds {args.seeds!r}: give a comma list of integers, e.g. 0,1,2") from None
    t0 = time.perf_counter()
    rows = measure(args.trace, seeds)
    text = section(args.trace, seeds, rows)
    print(text)
    if args.results:
        write_section(Path(args.results), MARK_START, MARK_END, "## How far a tail cut could go (bench/cut_ceiling.py)",
                      text)
    print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
