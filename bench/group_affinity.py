"""Group affinity routing (``ROLLOUT_GROUP_AFFINITY=1``, ``recipe/adapter/router.py``) in the simulator: what keeping a
GRPO group's n responses on one replica costs in load balance, against verl's least-loaded routing per request.

Reproduce: ``.venv/bin/python bench/group_affinity.py`` (~1 minute on 2 shared cores; prints its table).

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

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.sim import trace as T  # noqa: E402
from recipe.sim.engine import EngineParams, ReplicaTimeline, assign_replicas  # noqa: E402

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


def main() -> int:
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
