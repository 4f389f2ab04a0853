"""Group affinity routing (``ROLLOUT_GROUP_AFFINITY=1``, ``recipe/adapter/router.py``) in the simulator: what keeping a
GRPO group's n responses on one replica costs in load balance, against verl's least-loaded routing per request.

Reproduce: ``.venv/bin/python bench/group_affinity.py`` (~1 minute on 2 shared cores; prints its table).
``--placement`` (issue 34): where a group's history should live at the users' scale (17.4k prompts, n=16, 4
replicas), each placement's speed-up with the group drafter, the share of groups that find their history and the
imbalance (``.venv/bin/python bench/group_affinity.py --placement --seeds 0 1 2 --shapes reference heavy_tail``,
~3 minutes).

The steps are the fair baseline's (verl's seeded random order, batch 32 x n=16, no cap, no cut, no speculation) on
the simulator's reference trace and its heavy-tailed one, 4 replicas (16 GPUs as 4 x TP4, H100 KV capacity), every
epoch, seeds 0-2. All 512 requests of a step arrive before any finishes (``recipe/sim/engine.py``), so:

- ``per-request`` (verl): requests dealt in rounds of 4, each round to a random permutation of the replicas
  (``assign_replicas``): 128 requests per replica, a group's 16 responses spread ~4 per replica;
- ``group`` (the recipe's router): a group's first request goes to the least-loaded replica and its siblings follow,
  i.e. the 32 groups are dealt in rounds of 4: 8 whole groups (still 128 requests) per replica. The router's load
  guard (``max_excess`` 64) never acts here: loads never differ by more than one group (16);
- ``group-hash``: a group to ``hash(prompt) % 4`` with no load awareness (for scale: what a plain hash costs).

Per variant: the mean step time relative to ``per-request``, the mean over steps of the busiest replica's busy time
over the mean replica's (time imbalance), and of the busiest replica's tokens over the mean (token imbalance). What
affinity buys (suffix drafts from running siblings, ``ROLLOUT_SPECULATIVE=suffix``) is not modelled here.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.sim import trace as T  # noqa: E402
from recipe.sim.engine import KV_TOKENS, EngineParams, ReplicaTimeline, assign_replicas  # noqa: E402
from recipe.sim.speculation import AcceptanceCurve, SpecCost, Speculation  # noqa: E402

COMMAND = ".venv/bin/python bench/group_affinity.py"
SHAPES = ("reference", "heavy_tail")
SEEDS = (0, 1, 2)
BATCH = 32
VARIANTS = ("per-request", "group", "group-hash")


def placement(variant: str, groups: int, n: int, replicas: int, rng: np.random.Generator) -> np.ndarray:
    """The replica of each request (group-major: group g's responses are requests g*n .. g*n+n-1)."""
    if variant == "per-request":
        return assign_replicas(groups * n, replicas, rng)
    if variant == "group":
        return np.repeat(assign_replicas(groups, replicas, rng), n)
    if variant == "group-hash":
        return np.repeat(rng.integers(replicas, size=groups), n)
    raise ValueError(variant)


def step(lengths: np.ndarray, replica: np.ndarray, p: EngineParams) -> tuple[float, float, float]:
    """(step time, busiest / mean replica time, busiest / mean replica tokens) of one step."""
    times, tokens = [], []
    ctx = np.full(len(lengths), p.prompt_len)
    for rep in range(p.replicas):
        idx = np.flatnonzero(replica == rep)
        times.append(ReplicaTimeline(lengths[idx], ctx[idx], p).time_s if len(idx) else 0.0)
        tokens.append(float(lengths[idx].sum()))
    times, tokens = np.array(times), np.array(tokens)
    return float(times.max()), float(times.max() / times.mean()), float(tokens.max() / tokens.mean())


def measure(shape: str, seed: int, p: EngineParams) -> dict[str, np.ndarray]:
    """Per variant, per step: (time, time imbalance, token imbalance); the same steps and prompt order for all."""
    tr = T.generate(shape, seed=seed)
    epochs, rows, n = tr.lengths.shape
    order_rng = np.random.default_rng(seed)
    out: dict[str, list] = {v: [] for v in VARIANTS}
    for epoch in range(epochs):
        order = order_rng.permutation(rows)
        for s in range(rows // BATCH):
            lengths = tr.lengths[epoch, order[s * BATCH:(s + 1) * BATCH]].reshape(-1)
            for i, v in enumerate(VARIANTS):
                rng = np.random.default_rng((seed, epoch, s, i))
                out[v].append(step(lengths, placement(v, BATCH, n, p.replicas, rng), p))
    return {v: np.array(x) for v, x in out.items()}


# -- where a group's history lives (issue 34 item 3) ----------------------------------------------------------------
# Tokens per target step of the recipe's group drafter replayed on public code (docs/results.md, bench/group_drafter.py
# at depth 8): own context + running group, and with the prompt's earlier group finished in the corpus; draft tokens
# per step from the estimator's own + group (+ history) rows (bench/RESULTS.md). Public code, not RL reasoning: the
# history row is an upper bound (the same model wrote it), see docs/results.md.
TAU_GROUP, TAU_HISTORY = 1.514, 1.941
DRAFTED_GROUP, DRAFTED_HISTORY = 2.68, 3.27
DRAFT_S_PER_TOKEN = 1.0e-6  # the corpus's CPU time per emitted token (bench/group_drafter_cost.py, 8k prompts)
REPLICAS_PER_NODE = 2  # 8 GPUs per node as 2 x TP4
PLACEMENTS = ("least-loaded", "stable", "stable+guard", "node-shared", "replicated")
PLACEMENT_NOTES = {
    "least-loaded": "the group to the least-loaded replica every epoch (ROLLOUT_GROUP_AFFINITY before issue 34: its "
                    "LRU of 10,000 groups forgets a 17.4k-prompt epoch)",
    "stable": "a prompt's group always to the replica of its first epoch, load-blind",
    "stable+guard": "the replica of its first epoch unless that holds more than max_excess requests above the "
                    "least-loaded one: then the least-loaded (its history there is lost for the epoch); built",
    "node-shared": "least-loaded, the history shared by the node's replicas (a draft service per node: not built)",
    "replicated": "least-loaded, every replica holding every group's history (each indexes every text: its CPU time "
                  "and memory x replicas; not built)",
}


def route(policy: str, prompts: np.ndarray, home: dict, n: int, replicas: int, max_excess: int,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each group's replica and whether its history is there (``home``: prompt -> replica of its history, updated)."""
    loads = np.zeros(replicas, np.int64)
    where, hit = np.empty(len(prompts), np.int64), np.zeros(len(prompts), np.bool_)
    for g, prompt in enumerate(prompts):
        least = rng.choice(np.flatnonzero(loads == loads.min()))
        h = home.get(int(prompt))
        if policy == "stable":
            r = least if h is None else h
        elif policy == "stable+guard":
            r = h if h is not None and loads[h] - loads.min() <= max_excess else least
        else:
            r = least
        where[g] = r
        if h is not None:
            hit[g] = {"least-loaded": r == h, "stable": True, "stable+guard": r == h,
                      "node-shared": r // REPLICAS_PER_NODE == h // REPLICAS_PER_NODE, "replicated": True}[policy]
        if h is None or policy not in ("stable", "stable+guard"):
            home[int(prompt)] = r
        loads[r] += n
    return where, hit


def replica_time(lengths: np.ndarray, hit: np.ndarray, p: EngineParams, cpu_factor: float) -> float:
    """One replica's step with the group drafter: tokens per step mixed by the share of its tokens with history."""
    if not len(lengths):
        return 0.0
    share = float(lengths[hit].sum() / lengths.sum())
    tau = share * TAU_HISTORY + (1 - share) * TAU_GROUP
    drafted = share * DRAFTED_HISTORY + (1 - share) * DRAFTED_GROUP
    cost = SpecCost.for_gpu("h200", draft_s_per_token=0.0, draft_s_per_new_token=DRAFT_S_PER_TOKEN * cpu_factor,
                            ragged_drafts=True, curve=AcceptanceCurve((0,), (tau,), (drafted,)),
                            prompt_len=p.prompt_len)
    return ReplicaTimeline(lengths, np.full(len(lengths), p.prompt_len), p, speculation=Speculation(cost)).time_s


def placement(shape: str, seed: int, prompts: int, epochs: int, max_excess: int, p: EngineParams) -> dict:
    """Per placement: step time (later epochs) over verl's per-request routing without speculation, the share of
    groups that found their history, the busiest replica's time over the mean."""
    tr = T.generate(shape, seed=seed, num_prompts=prompts, epochs=epochs)
    n = tr.lengths.shape[2]
    order_rng = np.random.default_rng(seed)
    homes = {v: {} for v in PLACEMENTS}
    out = {v: [] for v in PLACEMENTS}
    base = []
    for epoch in range(epochs):
        order = order_rng.permutation(prompts)
        for s in range(prompts // BATCH):
            rows = order[s * BATCH:(s + 1) * BATCH]
            lengths = tr.lengths[epoch, rows]
            rng = np.random.default_rng((seed, epoch, s))
            t_base = step(lengths.reshape(-1), assign_replicas(BATCH * n, p.replicas, rng), p)[0]
            for v in PLACEMENTS:
                where, hit = route(v, rows, homes[v], n, p.replicas, max_excess, rng)
                cpu = p.replicas if v == "replicated" else 1.0
                times = [replica_time(lengths[where == r].reshape(-1), np.repeat(hit[where == r], n), p, cpu)
                         for r in range(p.replicas)]
                if epoch:
                    out[v].append((max(times), float(hit.mean()), max(times) / np.mean(times)))
            if epoch:
                base.append(t_base)
    total = float(np.sum(base))
    return {v: (total / np.sum([x[0] for x in rows_]), np.mean([x[1] for x in rows_]), np.mean([x[2] for x in rows_]))
            for v, rows_ in out.items()}


def placement_table(args) -> list[str]:
    p = dataclasses.replace(EngineParams(), kv_tokens=KV_TOKENS["h200"], replicas=args.replicas)
    lines = [f"Where a group's history lives: {args.prompts} prompts, n=16, batch {BATCH} x n, {p.replicas} replicas "
             f"of TP4 ({p.replicas * 4} GPUs, {REPLICAS_PER_NODE} per node), H200 KV, epochs 1-{args.epochs - 1} "
             f"(epoch 0 has no history), seeds {list(args.seeds)}; the group drafter at {TAU_GROUP} tokens per step "
             f"without history and {TAU_HISTORY} with it, {DRAFT_S_PER_TOKEN * 1e6:g} us of CPU per emitted token, "
             "async scheduling off (10%) and PIECEWISE graphs (3%) charged; speed-up over verl's per-request routing "
             f"without speculation ({COMMAND} --placement)", "",
             "| trace | placement | speed-up | groups finding their history | time imbalance (max/mean replica) |",
             "|---|---|---|---|---|"]
    for shape in args.shapes:
        runs = [placement(shape, seed, args.prompts, args.epochs, args.max_excess, p) for seed in args.seeds]
        for v in PLACEMENTS:
            su, hit, imb = (np.mean([r[v][i] for r in runs]) for i in range(3))
            lines.append(f"| {shape} | {v} | {su:.3f}x | {hit:.1%} | {imb:.3f} |")
    lines += [""] + [f"- `{v}`: {PLACEMENT_NOTES[v]}" for v in PLACEMENTS]
    return lines


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placement", action="store_true", help="where a group's history lives (issue 34 item 3)")
    ap.add_argument("--prompts", type=int, default=17408, help="prompts (DAPO-Math-17k de-duplicated: ~17.4k)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--max-excess", type=int, default=64)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--shapes", nargs="+", default=["reference"])
    args = ap.parse_args(argv)
    if args.placement:
        print("\n".join(placement_table(args)))
        return 0
    p = EngineParams()
    print(f"group affinity vs per-request routing: batch {BATCH} x n=16, {p.replicas} replicas, "
          f"max_num_seqs {p.max_num_seqs}, seeds {list(SEEDS)}, every epoch ({COMMAND})\n")
    print("| trace | routing | step time vs per-request | time imbalance (max/mean) | token imbalance (max/mean) |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        runs = [measure(shape, seed, p) for seed in SEEDS]
        base = np.mean([r["per-request"][:, 0].sum() for r in runs])
        for v in VARIANTS:
            total = np.mean([r[v][:, 0].sum() for r in runs])
            t_imb = np.mean([r[v][:, 1].mean() for r in runs])
            k_imb = np.mean([r[v][:, 2].mean() for r in runs])
            print(f"| {shape} | {v} | {total / base:.3f}x | {t_imb:.3f} | {k_imb:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
