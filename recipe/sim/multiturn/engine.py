"""The multi-turn engine model: a trajectory leaves the replica during each tool call and re-prefills on return
(the package docstring).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np


from ..engine import EngineParams, _steps_within, assign_replicas

REPREFILL = ("full", "new")


@dataclass
class ReplicaRun:
    finish: list  # wall time each trajectory finished (nan: not by the stop time)
    pos: list  # segments completed
    partial: list  # tokens of the assistant turn in progress at the stop (0 unless running)
    decoded: list  # assistant tokens decoded in this run
    time_s: float
    prefill_tokens: int = 0
    reprefill_tokens: int = 0  # prefilled again for trajectories back from a tool
    log: list | None = None  # (t0, t1, running set) per decode segment, ("tool", j, k, t0, t1) per tool call (tests)


def simulate_replica(segs: list, lats: list, pos0: list, p: EngineParams, *, priority: list | None = None,
                     stop: float = math.inf, reprefill: str = "full", log: bool = False) -> ReplicaRun:
    """One replica's schedule (module docstring) until every trajectory is done or wall time ``stop``."""
    if reprefill not in REPREFILL:
        raise ValueError(f"reprefill {reprefill!r} is not one of {REPREFILL}")
    n = len(segs)
    a_, b_, c_, pf, cap = p.decode_a, p.decode_b, p.decode_c, p.prefill_tok_s, p.max_num_seqs
    nseg = [0] * n
    for j, sg in enumerate(segs):
        for i in range(len(sg) - 1, -1, -1):
            if sg[i] > 0:
                nseg[j] = i + 1
                break
    pos = list(pos0)
    ctx = [p.prompt_len + sum(segs[j][: pos[j]]) for j in range(n)]
    finish, partial, decoded = [math.nan] * n, [0] * n, [0] * n
    fresh = [True] * n  # its first prefill in this launch: the whole context whatever ``reprefill`` says
    newtok = [0] * n
    off, start_clock = [0.0] * n, [0] * n
    fcfs = priority is None
    waiting: deque | list = deque() if fcfs else []
    seq = 0
    tools: list = []
    events = [] if log else None
    for j in range(n):
        if pos[j] >= nseg[j]:
            finish[j] = 0.0
        elif pos[j] % 2:
            heapq.heappush(tools, (float(lats[j][pos[j] // 2]), j))
            if log:
                events.append(("tool", j, pos[j] // 2, 0.0, float(lats[j][pos[j] // 2])))
        elif fcfs:
            waiting.append(j)
        else:
            heapq.heappush(waiting, (priority[j], seq, j))
            seq += 1
    t, clock, r, sum_off = 0.0, 0, 0, 0.0
    run: list = []
    pre_tok = re_tok = 0
    eps = 1e-9
    while True:
        while tools and tools[0][0] <= min(t, stop) + eps:
            tr, j = heapq.heappop(tools)
            newtok[j] = segs[j][pos[j]]
            ctx[j] += newtok[j]
            pos[j] += 1
            if pos[j] >= nseg[j]:
                finish[j] = tr  # the tool output reached the budget: the trajectory ends (truncated)
            elif fcfs:
                waiting.append(j)
            else:
                heapq.heappush(waiting, (priority[j], seq, j))
                seq += 1
        if t > stop + eps:
            break
        while waiting and r < cap and t <= stop + eps:
            j = waiting.popleft() if fcfs else heapq.heappop(waiting)[2]
            tok = ctx[j] if (fresh[j] or reprefill == "full") else newtok[j]
            if not fresh[j]:
                re_tok += tok
            fresh[j] = False
            pre_tok += tok
            t += pf * tok
            off[j] = ctx[j] - clock
            sum_off += off[j]
            r += 1
            start_clock[j] = clock
            heapq.heappush(run, (clock + segs[j][pos[j]], j))
        if r == 0:
            if tools and tools[0][0] <= stop + eps:
                t = max(t, tools[0][0])
                continue
            break
        k_end = run[0][0] - clock
        beta = c_ * r / 2.0
        alpha = a_ + b_ * r + c_ * (sum_off + r * clock) - beta
        full = alpha * k_end + beta * k_end * k_end
        k, stopping = k_end, False
        nxt = tools[0][0] if tools else math.inf
        if nxt <= stop and nxt < t + full:
            k = min(k_end, _steps_within(nxt - t, alpha, beta) + 1)  # the step in progress ends first
        elif stop < t + full - eps:
            k = min(k_end, _steps_within(stop - t, alpha, beta))
            stopping = k < k_end
        t0 = t
        t += alpha * k + beta * k * k
        clock += k
        if log:
            events.append((t0, t, frozenset(j for _, j in run)))
        if stopping:
            break
        while run and run[0][0] == clock:
            _, j = heapq.heappop(run)
            r -= 1
            sum_off -= off[j]
            a = segs[j][pos[j]]
            decoded[j] += a
            ctx[j] += a
            pos[j] += 1
            if pos[j] < nseg[j]:
                heapq.heappush(tools, (t + float(lats[j][pos[j] // 2]), j))
                if log:
                    events.append(("tool", j, pos[j] // 2, t, t + float(lats[j][pos[j] // 2])))
            else:
                finish[j] = t
    for _, j in run:
        partial[j] = clock - start_clock[j]
        decoded[j] += partial[j]
    end = max([0.0, *(f for f in finish if not math.isnan(f))])
    return ReplicaRun(finish=finish, pos=pos, partial=partial, decoded=decoded,
                      time_s=end if math.isinf(stop) else min(stop, max(end, t)), prefill_tokens=pre_tok,
                      reprefill_tokens=re_tok, log=events)


@dataclass
class MTStepTiming:
    finish: np.ndarray  # (m,) per trajectory (nan: not finished by the stop)
    pos: np.ndarray
    partial: np.ndarray
    decoded: np.ndarray
    time_s: float
    prefill_tokens: int
    reprefill_tokens: int
    replica: np.ndarray
    runs: list


def simulate_mt_step(seg: np.ndarray, lat: np.ndarray, pos0: np.ndarray, p: EngineParams, rng_seed,
                     *, priority=None, stop: float = math.inf, reprefill: str = "full",
                     log: bool = False) -> MTStepTiming:
    """All trajectories of a step (``seg[m, 2K]``, ``lat[m, K]``, starting at segment ``pos0[m]``), routed over the
    replicas (the same routing for the same ``rng_seed``: a stop run replays the full one)."""
    m = len(seg)
    replica = assign_replicas(m, p.replicas, np.random.default_rng(rng_seed))
    out = {k: np.zeros(m, dt) for k, dt in (("finish", float), ("pos", np.int64), ("partial", np.int64),
                                             ("decoded", np.int64))}
    runs, pre, re_ = [], 0, 0
    for rep in range(p.replicas):
        idx = np.flatnonzero(replica == rep)
        if not len(idx):
            continue
        rr = simulate_replica(seg[idx].tolist(), lat[idx].tolist(), pos0[idx].tolist(), p,
                              priority=None if priority is None else np.asarray(priority)[idx].tolist(), stop=stop,
                              reprefill=reprefill, log=log)
        for k in out:
            out[k][idx] = getattr(rr, k)
        pre, re_ = pre + rr.prefill_tokens, re_ + rr.reprefill_tokens
        runs.append((rep, idx, rr))
    time_s = max([0.0, *(rr.time_s for _, _, rr in runs)])
    return MTStepTiming(time_s=time_s, prefill_tokens=pre, reprefill_tokens=re_, replica=replica, runs=runs, **out)


# -- policies ----------------------------------------------------------------------------------------------------
