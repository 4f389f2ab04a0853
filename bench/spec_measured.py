"""The on-policy speed-up of speculative decoding at *measured* acceptance (issue 24 item 4): per drafter, on every
trace shape, with the costs ``recipe/sim/speculation.py`` charges (async scheduling off, CPU drafting time, the
schedule's CUDA graphs), and the acceptance below which speculation loses.

Input: the estimator's report on real sampled text, ``bench/acceptance.py --json-out PATH`` (CodeGen-16B on
HumanEval at T=0.8; the data stay outside the repository). Each drafter's tokens per target step by position
(``recipe.sim.speculation.AcceptanceCurve``) replaces the published EAGLE figure. The public responses are short
(48 tokens on average, at most 300), the simulated ones ~6000 tokens: ``by position`` holds the last measured bucket
(from token 256 on) for the rest of each response, ``flat`` uses the overall figure everywhere.

The recipe's own drafter (``ROLLOUT_SPECULATIVE=group``) runs on the own + group + history curve with its CPU cost
per emitted token (``--group-s-per-token``, from ``bench/group_drafter.py``) in place of ngram's context scan.

Policies: ``best-onpolicy-spec`` (draft at every step) and ``onpolicy-spec-tail`` (draft while a replica runs at
most 32 sequences), against ``tailcut-budget-spec-off`` (the same order and cut without speculation); speed-ups over
``baseline`` (verl's random order), epochs 1-3, mean of trace seeds 0-2, H200 (the roofline's bandwidth and the KV
capacity). Break-even: the tokens per step (every step drafting ``k`` tokens) at which speculation is as fast as the
cut alone, by bisection.

Reproduce: ``.venv/bin/python bench/spec_measured.py --acceptance /tmp/acc_data/humaneval_report.json --results
bench/RESULTS.md`` (~5 min on 2 shared cores). The section goes between the ``spec_measured`` markers.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.report.sections import section_main  # noqa: E402
from recipe.sim import trace as T  # noqa: E402
from recipe.sim.engine import KV_TOKENS, EngineParams  # noqa: E402
from recipe.sim.run import run_policy, summarize  # noqa: E402
from recipe.sim.speculation import AcceptanceCurve, SpecCost, needed_tau  # noqa: E402

MARK_START, MARK_END = "<!-- spec_measured:start -->", "<!-- spec_measured:end -->"
HEADING = "## Speculation at measured acceptance in the simulator (bench/spec_measured.py)"
SHAPES = ("reference", "heavy_tail", "bimodal")
SEEDS = (0, 1, 2)
GPU = "h200"
DRAFTERS = ("ngram:k=4:min=5:max=5", "ngram:k=4:min=1:max=3", "suffix:own:k=4:depth=24:min=1",
            "suffix:group:k=4:depth=24:min=1", "suffix:own+group:k=4:depth=24:min=1",
            "suffix:own+group+history:k=4:depth=24:min=1")
ALWAYS, TAIL, CUT = "best-onpolicy-spec", "onpolicy-spec-tail", "tailcut-budget-spec-off"
GROUP_CURVE = "suffix:own+group+history:k=4:depth=24:min=1"
GROUP_S_PER_TOKEN = 11e-6  # the Python corpus before issue 34 (bench/group_drafter.py, 10.9 us at depth 8); the
# rebuilt corpus's ~1 us, with affinity and the graph fallback, is bench/group_drafter_sim.py's

_cache: dict = {}


def speedup(shape: str, name: str, cost: SpecCost | None = None) -> float:
    """Mean over the seeds of ``name``'s speed-up over baseline."""
    out = []
    for seed in SEEDS:
        key = (shape, seed)
        if key not in _cache:
            tr = T.generate(shape, seed=seed)
            eng = EngineParams(kv_tokens=KV_TOKENS[GPU])
            _cache[key] = (tr, tr.previous_run(), eng, run_policy(tr, "baseline", eng, batch_size=32, seed=seed))
        tr, prev, eng, base = _cache[key]
        run = run_policy(tr, name, eng, batch_size=32, seed=seed, previous=prev,
                         spec_cost=dataclasses.replace(cost, prompt_len=eng.prompt_len) if cost else None)
        s = summarize(run, tr.epochs, tr.num_prompts, base)
        assert s["max_policy_versions"] == 1
        out.append(s["speedup_vs_baseline"])
    return float(np.mean(out))


def flat(curve: AcceptanceCurve, tau: float, drafted: float) -> AcceptanceCurve:
    return AcceptanceCurve((0,), (tau,), (drafted,), curve.source + " (flat)")


def section(args) -> str:
    rep = json.loads(Path(args.acceptance).read_text())
    drafters = rep["drafters"]
    base = SpecCost.for_gpu(GPU)
    lines = [f"Reproduce: `.venv/bin/python bench/spec_measured.py --acceptance PATH --results bench/RESULTS.md` "
             f"(PATH: `bench/acceptance.py --json-out`; measured on {rep['source']}). Costs charged "
             f"(`recipe/sim/speculation.py`): async scheduling off {100 * base.sync_penalty:g}% of every step of a "
             f"speculating run; CPU drafting {base.draft_s_per_token * 1e9:g} ns per context token of each drafting "
             f"sequence per step (vLLM's ngram proposer, measured here); the tail schedule's PIECEWISE CUDA graphs "
             f"{100 * base.graph_penalty:g}% of every step. Speed-up over `baseline`, epochs 1-3, mean of seeds 0-2, "
             f"{GPU}.", ""]
    cut = {sh: speedup(sh, CUT) for sh in SHAPES}
    lines += ["| drafter | tokens per step (overall) | draft tokens per step | "
              + " | ".join(f"{sh}: always, by position / flat / tail" for sh in SHAPES) + " |",
              "|---|---|---|" + "---|" * len(SHAPES),
              "| (cut only, no speculation) | 1 | 0 | " + " | ".join(f"{cut[sh]:.3f}" for sh in SHAPES) + " |"]
    # the recipe's group drafter: the own + group + history curve (bench/group_drafter.py replays the drafter itself
    # within 2% of it), with its own CPU cost per emitted token instead of ngram's context scan
    group_cost = dataclasses.replace(base, draft_s_per_token=0.0, draft_s_per_new_token=args.group_s_per_token)
    rows = [(f"`{name}`", name, base) for name in DRAFTERS] + [
        (f"`ROLLOUT_SPECULATIVE=group` ({1e6 * args.group_s_per_token:g} us per emitted token on the CPU)",
         GROUP_CURVE, group_cost)]
    for label, name, cost in rows:
        s = drafters[name]
        curve = AcceptanceCurve.from_report(rep, name)
        kbar = s["draft_tokens"] / s["steps"]
        cells = []
        for sh in SHAPES:
            a = speedup(sh, ALWAYS, dataclasses.replace(cost, curve=curve))
            f = speedup(sh, ALWAYS, dataclasses.replace(cost, curve=flat(curve, s["tokens_per_step"], kbar)))
            t = speedup(sh, TAIL, dataclasses.replace(cost, curve=curve))
            cells.append(f"{a:.3f} / {f:.3f} / {t:.3f}")
        lines.append(f"| {label} | {s['tokens_per_step']:.3f} | {kbar:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "Break-even: the tokens per step (flat, every step drafting k tokens) at which speculation is as "
              "fast as the cut alone (bisection to 0.01; `> 2.5`: not reached):", "",
              "| trace | always, k=4 | always, k=1 | tail (<= 32 running), k=4 |", "|---|---|---|---|"]
    for sh in SHAPES:
        row = []
        for mode, k in ((ALWAYS, 4.0), (ALWAYS, 1.0), (TAIL, 4.0)):
            def at(tau, mode=mode, k=k, sh=sh):
                return speedup(sh, mode, dataclasses.replace(base, curve=AcceptanceCurve((0,), (tau,), (k,))))
            need = needed_tau(at, cut[sh], lo=1.0, hi=2.5, tol=0.01)
            row.append("> 2.5" if need is None else f"{need:.2f}")
        lines.append(f"| {sh} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def add_arguments(ap) -> None:
    ap.add_argument("--acceptance", required=True, help="bench/acceptance.py --json-out's file")
    ap.add_argument("--group-s-per-token", type=float, default=GROUP_S_PER_TOKEN,
                    help="the group drafter's CPU seconds per emitted token (bench/group_drafter.py, depth 8)")


def main(argv=None) -> int:
    return section_main(__doc__, section, MARK_START, MARK_END, HEADING, argv, add_arguments)


if __name__ == "__main__":
    sys.exit(main())
