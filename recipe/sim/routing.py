"""The group-affinity router as built (``recipe/adapter/router.py``, ``GroupAffinityLoadBalancer``) in the simulator:
homes, the per-request load guard and the splits it makes, on the arrivals verl's agent loop produces.

* **Homes**: a prompt's home is a rendezvous hash over the replicas' ranks (the router hashes the prompt's tokens, the
  simulator the dataset row: both uniform, stable across epochs and restarts, and a replica that leaves moves only its
  own prompts).
* **Arrivals**: verl 0.9.1's ``AgentLoopManager`` splits a step's batch (group-major, a group's n responses adjacent)
  into ``agent.num_workers`` contiguous chunks (8 by default), and the workers submit their chunks concurrently: the
  router sees the chunks interleaved at random, each worker's requests in their order (``worker_arrivals``). Every
  request of a synchronous step arrives before any finishes, so a replica's load is the requests it has been given in
  this step.
* **Guard**: per request, the group's replica now (its home, or where the guard moved the group's earlier requests)
  unless that holds more than ``max_excess`` requests above the least-loaded replica; then the least-loaded (random
  ties), and the rest of the group follows it there (``route_step``). A group can so end fully home, split over
  replicas, or moved whole (``placement_shares``).

``tests/sim/test_routing.py`` drives the real class and this model with the same arrivals and checks the shares agree;
``python -m recipe.sim.routing`` prints them at a run's scale (the users': ~88% of groups fully home, ~12% split).
Left out: replicas' admission order (the engine model admits a step's requests in batch order, not arrival order).
"""
from __future__ import annotations

import numpy as np

AGENT_WORKERS = 8  # verl 0.9.1 rollout.yaml agent.num_workers
MAX_EXCESS = 64  # configs/router/group_affinity.yaml max_excess

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of each uint64."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return x ^ (x >> np.uint64(31))


def homes(rows, ranks, seed: int = 0) -> np.ndarray:
    """The home of each dataset row among the replicas of ``ranks`` (an int, or the ranks in the pool): the rank whose
    hash of (row, rank) is highest (rendezvous hashing, as the router does over its servers' ranks)."""
    ranks = np.arange(ranks) if np.ndim(ranks) == 0 else np.asarray(ranks)
    if ranks.size == 0:
        raise ValueError("homes: no replica in the pool")
    r = np.asarray(rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        key = _mix(r * np.uint64(0x100000001B3) ^ np.uint64(seed))
        scores = _mix(key[..., None] ^ (ranks.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)))
    return ranks[np.argmax(scores, axis=-1)]


def worker_arrivals(requests: int, workers: int, rng: np.random.Generator) -> np.ndarray:
    """The order the router sees a step's ``requests`` (indices in batch order): ``workers`` contiguous chunks, as
    ``DataProto.chunk`` cuts them, in a uniformly random interleaving (each worker's own in order)."""
    if requests < 0 or workers < 1:
        raise ValueError(f"worker_arrivals needs requests >= 0 and workers >= 1, got {requests}, {workers}")
    size = -(-requests // workers) if requests else 0
    owner = np.minimum(np.arange(requests) // max(size, 1), workers - 1)
    draw = owner.copy()
    rng.shuffle(draw)  # a random interleaving: the sequence of workers is a random permutation of the chunks' labels
    order = np.empty(requests, np.int64)
    for w in range(workers):  # the k-th arrival from worker w is its chunk's k-th request
        order[draw == w] = np.flatnonzero(owner == w)
    return order


def route_step(groups, home, replicas: int, max_excess: int | None, rng: np.random.Generator) -> np.ndarray:
    """The replica of each request of one step, ``groups`` in arrival order (each request's group) and ``home`` each
    request's group's home, as ``GroupAffinityLoadBalancer`` places them (see the module docstring)."""
    groups, home = np.asarray(groups).tolist(), np.asarray(home).tolist()
    if max_excess is not None and max_excess < 0:
        raise ValueError(f"max_excess={max_excess}: an int >= 0, or None for no guard")
    loads = [0] * replicas
    now: dict = {}  # group -> its replica now
    out = np.empty(len(groups), np.int64)
    ties = rng.random(len(groups))
    for i, (g, h) in enumerate(zip(groups, home)):
        r = now.get(g, h)
        least = min(loads)
        if max_excess is not None and loads[r] - least > max_excess:
            cands = [k for k, c in enumerate(loads) if c == least]
            r = cands[int(ties[i] * len(cands))]
        now[g] = r
        loads[r] += 1
        out[i] = r
    return out


def placement_shares(groups, replica, home) -> dict:
    """Per group: ``fully_home`` (every request at its home), ``split`` (over more than one replica), ``moved`` (all on
    one replica, not home); shares of the groups."""
    groups, replica, home = np.asarray(groups), np.asarray(replica), np.asarray(home)
    ids, inv = np.unique(groups, return_inverse=True)
    inv = inv.ravel()
    lo = np.full(len(ids), np.iinfo(np.int64).max)
    hi = np.full(len(ids), -1)
    np.minimum.at(lo, inv, replica)
    np.maximum.at(hi, inv, replica)
    away = np.bincount(inv, replica != home, len(ids)) > 0
    split = lo != hi
    return {"groups": len(ids), "fully_home": float(np.mean(~away)), "split": float(np.mean(split)),
            "moved": float(np.mean(away & ~split))}


def route_requests(groups, replicas: int, *, rng: np.random.Generator, workers: int = AGENT_WORKERS,
                   max_excess: int | None = MAX_EXCESS, seed: int = 0) -> np.ndarray:
    """The replica of each request of one step, ``groups`` its group (dataset row) in batch order: arrivals from
    ``workers`` agent workers, homes, the guard."""
    group = np.asarray(groups).ravel()
    order = worker_arrivals(len(group), workers, rng)
    out = np.empty(len(group), np.int64)
    out[order] = route_step(group[order], homes(group[order], replicas, seed), replicas, max_excess, rng)
    return out


def home_share(prompts: int, n: int, batch: int, replicas: int, *, epochs: int = 2, workers: int = AGENT_WORKERS,
               max_excess: int | None = MAX_EXCESS, seed: int = 0) -> dict:
    """Over epochs 1.. of ``prompts`` shuffled into steps of ``batch``: the placement shares and ``history``, the
    share of requests sent to a replica that ran their prompt in an earlier epoch (where its history is)."""
    rng = np.random.default_rng(seed)
    last = np.full((prompts, replicas), -1, np.int64)  # epoch a prompt last ran on each replica
    groups, where, home, hit = [], [], [], []
    for epoch in range(epochs):
        order = rng.permutation(prompts)
        for s in range(prompts // batch):
            rows = order[s * batch:(s + 1) * batch]
            g = np.repeat(rows, n)
            rep = route_requests(g, replicas, rng=rng, workers=workers, max_excess=max_excess, seed=seed)
            if epoch:
                groups.append(g + epoch * prompts)
                where.append(rep)
                home.append(homes(g, replicas, seed))
                hit.append(last[g, rep] >= 0)
            last[g, rep] = epoch
    if not groups:
        raise ValueError("home_share needs epochs >= 2 and at least one full batch")
    out = placement_shares(np.concatenate(groups), np.concatenate(where), np.concatenate(home))
    return {**out, "history": float(np.mean(np.concatenate(hit)))}


def main(argv=None) -> int:
    """``python -m recipe.sim.routing``: the router's placement shares and history share at a run's scale."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m recipe.sim.routing", description=main.__doc__)
    ap.add_argument("--prompts", type=int, default=17408, help="dataset prompts (DAPO-Math-17k de-duplicated)")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32, help="prompts per step")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--workers", type=int, default=AGENT_WORKERS, help="verl agent.num_workers")
    ap.add_argument("--max-excess", type=int, default=MAX_EXCESS, help="the router's guard (-1: none)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    out = home_share(a.prompts, a.n, a.batch, a.replicas, epochs=a.epochs, workers=a.workers,
                     max_excess=None if a.max_excess < 0 else a.max_excess, seed=a.seed)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
