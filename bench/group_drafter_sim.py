"""The on-policy speed-up of the group drafter (``ROLLOUT_SPECULATIVE=group``) in the simulator with every cost charged
(issue 34 item 4): its measured CPU time per emitted token, group affinity's load imbalance (the router's homes,
per-request guard and splits, ``recipe/sim/routing.py``), PIECEWISE CUDA graphs on every step (drafts of 0..K tokens per
request), async scheduling off, and the history the engine can reach (``recipe/sim/corpus_limits.py``) next to the
unlimited one.

Acceptance (tokens per target step, flat over the response, and draft tokens per step) from the files in
``recipe/sim/curves`` (each names what was measured where): public code (CodeT's HumanEval samples, CodeGen-16B,
T=0.8; the samples stay outside the repository), the drafter replayed as vLLM runs it (``bench/group_drafter.py``,
depth 8): own + group (a first epoch), own + group + history, ngram 1-3; and held-out sampled math as issue 43
reports it (own + group, no history; measured outside this repository).

Policies: ``best-onpolicy-spec`` (tail cut at the truncation budget, longest-first, drafting at every step) against
``tailcut-budget-spec-off`` (the same without speculation); speed-ups over ``baseline`` (verl's random order),
epochs 1-3 (an epoch's history is there from epoch 1), mean of trace seeds 0-2, H200.

The history an engine keeps is the users' scale's (17,408 prompts x 16 over 4 engines, ~6.2k-token texts): its
count bound (``ROLLOUT_SPECULATIVE_SUFFIX_CACHED``) and byte bound (``--corpus-gib``, ``ROLLOUT_SPECULATIVE_CORPUS_GIB``
per engine), whichever keeps fewer texts; the summary names which binds.

Reproduce: ``.venv/bin/python bench/group_drafter_sim.py [--corpus-gib GIB]`` (~4 min on 2 shared cores).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from spec_measured import ALWAYS, CUT, GPU, SHAPES, speedup  # noqa: E402

from recipe.drafting.bounds import CORPUS_GIB, DEFAULT_CORPUS_GIB  # noqa: E402
from recipe.sim.corpus_limits import EngineLimits, engine_tokens_per_step  # noqa: E402
from recipe.sim.speculation import AcceptanceCurve, SpecCost  # noqa: E402

COMMAND = ".venv/bin/python bench/group_drafter_sim.py"
CURVES = ROOT / "recipe" / "sim" / "curves"


def summary(file: str, drafter: str) -> tuple[float, float]:
    """(tokens per step, draft tokens per step) of ``drafter`` in ``recipe/sim/curves/<file>``."""
    c = AcceptanceCurve.from_report(json.loads((CURVES / file).read_text()), drafter)
    return c.tau[0], c.drafted[0]


CODE, MATH = "code-humaneval-codet.json", "math-heldout-issue43.json"
OWN_GROUP = summary(CODE, "suffix:own+group:k=4:depth=8:min=1")
HISTORY = summary(CODE, "suffix:own+group+history:k=4:depth=8:min=1")
NGRAM = summary(CODE, "ngram:k=4:min=1:max=3")
MATH_SETS = [summary(MATH, f"suffix:own+group:k=4:depth=8:min=1:set={i}") for i in (1, 2)]
GROUP_S_PER_TOKEN = 1.0e-6  # bench/group_drafter_cost.py: 0.7-1.0 us at 250-8000-token prompts
OLD_S_PER_TOKEN = 11e-6  # the Python corpus before issue 34 (bench/group_drafter.py, ~130-token code prompts)


def cost(tau_drafted, *, cpu: float = GROUP_S_PER_TOKEN, affinity: bool = True, ragged: bool = True) -> SpecCost:
    tau, drafted = tau_drafted
    return SpecCost.for_gpu(GPU, draft_s_per_token=0.0, draft_s_per_new_token=cpu, ragged_drafts=ragged,
                            group_affinity=affinity, curve=AcceptanceCurve((0,), (tau,), (drafted,)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/group_drafter_sim.py", description=__doc__.splitlines()[0])
    ap.add_argument("--corpus-gib", type=float, default=DEFAULT_CORPUS_GIB, help=f"{CORPUS_GIB} per engine")
    args = ap.parse_args(argv)
    try:
        lim = EngineLimits(corpus_gib=args.corpus_gib)
    except ValueError as exc:
        ap.error(f"--corpus-gib: {exc}")
    engine = (engine_tokens_per_step(HISTORY[0], OWN_GROUP[0], lim), HISTORY[1])
    rows = [
        ("tail cut alone (no speculation)", None, None),
        (f"ngram 1-3 ({NGRAM[0]}), its context scan, PIECEWISE graphs", NGRAM,
         SpecCost.for_gpu(GPU, ragged_drafts=True, curve=AcceptanceCurve((0,), (NGRAM[0],), (NGRAM[1],)))),
        (f"group, first epoch: own + group ({OWN_GROUP[0]})", OWN_GROUP, cost(OWN_GROUP)),
        (f"group, later epochs under the engine's limits ({engine[0]:.3f}: {lim.history_share:.1%} find their "
         "history)", engine, cost(engine)),
        (f"group, unlimited history ({HISTORY[0]}): the estimator's figure", HISTORY, cost(HISTORY)),
        (f"group under the engine's limits, drafting free ({engine[0]:.3f})", engine, cost(engine, cpu=0.0)),
        (f"group under the engine's limits, affinity not charged ({engine[0]:.3f})", engine,
         cost(engine, affinity=False)),
        (f"group before issue 34: 11 us per token, no affinity or graph charge ({HISTORY[0]})", HISTORY,
         cost(HISTORY, cpu=OLD_S_PER_TOKEN, affinity=False, ragged=False)),
    ] + [(f"math, own + group, no history, set {i + 1} ({m[0]}; as issue 43 reports it, not measured here)", m,
           cost(m)) for i, m in enumerate(MATH_SETS)]
    command = COMMAND + (f" --corpus-gib {args.corpus_gib:g}" if args.corpus_gib != DEFAULT_CORPUS_GIB else "")
    print(f"Reproduce: `{command}`. Later epochs at the users' scale: {lim.bound_line}, "
          f"{lim.history_share:.1%} find their history. Speed-up over `baseline`, epochs 1-3, mean of seeds 0-2, {GPU}; "
          "all rows but the first run `best-onpolicy-spec` (the tail cut's order and cut, drafting at every step).\n")
    print("| drafter (tokens per step) | " + " | ".join(SHAPES) + " |")
    print("|---|" + "---|" * len(SHAPES))
    for label, _, c in rows:
        cells = [speedup(sh, CUT) if c is None else speedup(sh, ALWAYS, c) for sh in SHAPES]
        print(f"| {label} | " + " | ".join(f"{x:.3f}x" for x in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
