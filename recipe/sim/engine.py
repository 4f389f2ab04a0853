"""A continuous-batching rollout engine model: how long one synchronous GRPO step takes for given response lengths.

Model (per rollout replica, e.g. 4 replicas of TP4 on 16 GPUs):

* All requests of a step are submitted at t=0 (verl's agent-loop workers gather every row of the batch at once).
  verl 0.9.1 routes each request with ``GlobalRequestLoadBalancer``: least in-flight requests, ties broken at
  random. With every request arriving before any finishes, that deals requests in rounds of ``replicas``, each
  round to a random permutation of the replicas; that is what ``assign_replicas`` does.
* A replica runs at most ``max_num_seqs`` sequences (vLLM continuous batching, FCFS). A finished sequence frees its
  slot at once and the next queued request starts (after its prefill).
* One decode step advances every running sequence by one token and takes ``a + b * running + c * context``, where
  ``context`` is the sum of prompt + generated tokens of the running sequences (the KV read). A request starting
  with ``context0`` tokens (the prompt, plus the partial response when a partial rollout resumes it) first costs
  ``prefill_tok_s * context0``; prefill stalls the replica's decoding (a simplification of chunked prefill).
* The KV-cache capacity is not modelled (no preemption). Worst case at the default 128 requests per replica:
  128 x 16.6k tokens x 96 KiB = 204 GB, which TP4 on H200 holds; on 80 GB H100s vLLM could preempt late in long
  steps (typical occupancy is about a third of the worst case).

The simulation is exact for this model and vectorised: starts/finishes are computed in "token clock" units (decode
steps), and between two consecutive start/finish events the running set is fixed, so the time of the whole segment
is a closed-form sum. One step of 512 requests costs well under a millisecond per replica.

Default parameters are estimates for Qwen3-30B-A3B (3B active, bf16, 48 layers, 4 KV heads x 128) on H100/H200
TP4 replicas, not measurements: ~10 ms per decode step at small batch (a; single-stream MoE decode with TP4
all-reduces is ~80-120 tokens/s on H100-class GPUs), ~0.08 ms per extra running sequence (b; expert and attention
compute), KV read ~5e-9 s per context token (c; 96 KiB/token spread over 4 GPUs at ~3-4 TB/s effective). At 128
sequences with 6k tokens of context each a step then takes ~24 ms: ~5k tokens/s per replica, ~21k for 16 GPUs.
Replace them with ``fit_engine`` on measured steps when you have them.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EngineParams:
    replicas: int = 4  # 16 GPUs as 4 x TP4
    max_num_seqs: int = 256  # verl 0.9.1 rollout.yaml default
    decode_a: float = 0.010  # s per decode step (weights, launch, all-reduce)
    decode_b: float = 8e-5  # s per running sequence per decode step
    decode_c: float = 5e-9  # s per context token per decode step (KV read)
    prefill_tok_s: float = 1e-5  # s per prefilled token (~100k tokens/s per replica)
    prompt_len: int = 256  # prompt tokens per request

    def __post_init__(self):
        if self.replicas < 1 or self.max_num_seqs < 1:
            raise ValueError("replicas and max_num_seqs must be >= 1")
        times = (self.decode_a, self.decode_b, self.decode_c, self.prefill_tok_s)
        if min(times) < 0 or self.decode_a + self.decode_b <= 0:
            raise ValueError("engine time parameters must be >= 0 and a decode step must take time")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def assign_replicas(num_requests: int, replicas: int, rng: np.random.Generator) -> np.ndarray:
    """Replica of each request in submission order: least in-flight with random ties (verl 0.9.1)."""
    rounds = -(-num_requests // replicas)
    return np.argsort(rng.random((rounds, replicas)), axis=1).ravel()[:num_requests]


def fifo_starts(lengths: np.ndarray, slots: int) -> np.ndarray:
    """Token clock at which each request starts on one replica (FCFS, a slot frees when its sequence ends)."""
    starts = np.zeros(len(lengths), np.int64)
    if len(lengths) > slots:
        free = [int(x) for x in lengths[:slots]]
        heapq.heapify(free)
        for j in range(slots, len(lengths)):
            t = heapq.heappop(free)
            starts[j] = t
            heapq.heappush(free, t + int(lengths[j]))
    return starts


class ReplicaTimeline:
    """The exact schedule of one replica for one step: per-request start/finish and wall-clock times."""

    def __init__(self, lengths: np.ndarray, context0: np.ndarray, p: EngineParams):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.size and self.lengths.min() < 1:
            raise ValueError("every request generates at least one token")
        self.p = p
        self.start = fifo_starts(self.lengths, p.max_num_seqs)
        finish = self.start + self.lengths
        ev = np.unique(np.concatenate([[0], self.start, finish]))  # token-clock event points
        ks, kf = np.searchsorted(ev, self.start), np.searchsorted(ev, finish)
        k = len(ev)
        n_start = np.bincount(ks, minlength=k)
        offset = np.asarray(context0, dtype=np.float64) - self.start  # context at clock t is offset + t
        running = np.cumsum(n_start - np.bincount(kf, minlength=k))
        ctx0 = np.cumsum(np.bincount(ks, offset, k) - np.bincount(kf, offset, k))  # sum of offsets while running
        d = np.diff(ev).astype(np.float64)
        e0, r, a0 = ev[:-1].astype(np.float64), running[:-1].astype(np.float64), ctx0[:-1]
        # Segment k: d steps with r running; the context sum at step t is a0 + r * t.
        seg = d * (p.decode_a + p.decode_b * r) + p.decode_c * (d * a0 + r * (d * e0 + d * (d - 1) / 2))
        seg = np.where(r > 0, seg, 0.0)
        prefill = np.cumsum(np.bincount(ks, p.prefill_tok_s * np.asarray(context0, dtype=np.float64), k))
        seg_cum = np.concatenate([[0.0], np.cumsum(seg)])
        self._ev, self._r, self._a0 = ev, r, a0
        self._seg_start = seg_cum[:-1] + prefill[:-1]  # wall time when segment k starts decoding
        reach = seg_cum + np.concatenate([[0.0], prefill[:-1]])  # wall time when the clock reaches ev[k]
        self.finish_time = reach[kf]
        self.time_s = float(reach[-1]) if self.lengths.size else 0.0

    def tokens_by(self, t: float) -> np.ndarray:
        """Tokens each request has generated by wall time ``t`` (an abort at ``t`` keeps these)."""
        if t >= self.time_s:
            return self.lengths.copy()
        k = int(np.searchsorted(self._seg_start, t, side="right")) - 1
        if k < 0:
            return np.zeros_like(self.lengths)
        p, r, e0 = self.p, self._r[k], float(self._ev[k])
        # Elapsed after j steps of segment k: alpha * j + beta * j**2 (quadratic through the context term).
        beta = p.decode_c * r / 2
        alpha = p.decode_a + p.decode_b * r + p.decode_c * (self._a0[k] + r * e0) - beta
        dt = t - self._seg_start[k]
        j = dt / alpha if beta == 0 else (-alpha + math.sqrt(alpha * alpha + 4 * beta * dt)) / (2 * beta)
        clock = e0 + min(math.floor(j + 1e-9), int(self._ev[k + 1] - e0))
        return np.clip(clock - self.start, 0, self.lengths)


@dataclass
class StepTiming:
    """One step over all replicas: request ``i`` ran on ``replica[i]`` and finished at ``finish_time[i]``."""

    replica: np.ndarray
    finish_time: np.ndarray
    time_s: float
    timelines: list[ReplicaTimeline]

    def tokens_by(self, t: float) -> np.ndarray:
        out = np.zeros(len(self.replica), np.int64)
        for rep, tl in enumerate(self.timelines):
            out[self.replica == rep] = tl.tokens_by(t)
        return out


def simulate_step(lengths, p: EngineParams, rng: np.random.Generator, context0=None) -> StepTiming:
    """Time one step whose requests (in submission order) generate ``lengths`` tokens each, starting from
    ``context0`` tokens of context (default: the prompt)."""
    lengths = np.asarray(lengths, dtype=np.int64).ravel()
    ctx = np.full(len(lengths), p.prompt_len) if context0 is None else np.asarray(context0).ravel()
    replica = assign_replicas(len(lengths), p.replicas, rng)
    finish = np.zeros(len(lengths))
    timelines = []
    for rep in range(p.replicas):
        idx = np.flatnonzero(replica == rep)
        tl = ReplicaTimeline(lengths[idx], ctx[idx], p)
        finish[idx] = tl.finish_time
        timelines.append(tl)
    return StepTiming(replica=replica, finish_time=finish, time_s=max([0.0, *(tl.time_s for tl in timelines)]),
                      timelines=timelines)


# -- lower bounds ------------------------------------------------------------------------------------------------
def alone_time(lengths, p: EngineParams) -> np.ndarray:
    """Time each (fresh) response would take alone on an idle replica: no schedule can finish it sooner."""
    length = np.asarray(lengths, dtype=np.float64)
    decode = length * (p.decode_a + p.decode_b) + p.decode_c * (length * p.prompt_len + length * (length - 1) / 2)
    return decode + p.prefill_tok_s * p.prompt_len


def peak_rate(p: EngineParams, num_requests: int) -> float:
    """Most tokens/s the replicas can decode with ``num_requests`` in flight (context term ignored): the rate
    r / (a + b r) grows with r, and an even split over replicas maximises the sum of these concave rates."""
    r = min(p.max_num_seqs, num_requests / p.replicas)
    return p.replicas * r / (p.decode_a + p.decode_b * r) if r > 0 else 0.0


def step_lower_bound(lengths, p: EngineParams) -> float:
    """max(longest response alone, total tokens / peak rate)."""
    lengths = np.asarray(lengths).ravel()
    if lengths.size == 0:
        return 0.0
    return max(float(alone_time(lengths.max(), p)), float(lengths.sum()) / peak_rate(p, lengths.size))


def epoch_lower_bound(lengths: np.ndarray, batch_size: int, p: EngineParams) -> float:
    """Bound for one epoch of uncapped ``lengths[row, sample]`` split into steps of ``batch_size`` rows, over every
    possible ordering: the sum of step maxima is smallest when rows are grouped by their longest response (take
    every batch_size-th of the sorted group maxima), and no step beats the peak rate."""
    group_alone = np.sort(alone_time(lengths.max(axis=1), p))[::-1]
    by_order = float(group_alone[::batch_size].sum())
    by_rate = float(lengths.sum()) / peak_rate(p, batch_size * lengths.shape[1])
    return max(by_order, by_rate)


# -- fitting -----------------------------------------------------------------------------------------------------
def fit_engine(records: Iterable[Mapping], replicas: int = EngineParams.replicas) -> dict:
    """Least-squares ``decode_a``, ``decode_b`` (>= 0) from measured steps ``{max_len, sum_len, time_s}``.

    With every request starting at once and no queueing, a replica's step takes ``a * max_len + b * sum_len``
    decode-seconds (the KV and prefill terms are folded into a and b, so use the fit with ``decode_c=0`` and
    ``prefill_tok_s=0``); the busiest replica carries about ``sum_len / replicas``.
    """
    recs = list(records)
    if len(recs) < 2:
        raise ValueError(f"fit_engine needs at least 2 measured steps, got {len(recs)}")
    x = np.array([[r["max_len"], r["sum_len"] / replicas] for r in recs], dtype=np.float64)
    y = np.array([r["time_s"] for r in recs], dtype=np.float64)
    candidates = [np.linalg.lstsq(x, y, rcond=None)[0]]
    for col in (0, 1):  # the two one-parameter fits, for when the joint one goes negative
        coef = np.zeros(2)
        coef[col] = max(0.0, float(x[:, col] @ y) / float(x[:, col] @ x[:, col]))
        candidates.append(coef)
    ok = [c for c in candidates if (c >= 0).all()]
    best = min(ok, key=lambda c: float(((x @ c - y) ** 2).sum()))
    rmse = float(np.sqrt(((x @ best - y) ** 2).mean()))
    return {"decode_a": float(best[0]), "decode_b": float(best[1]), "decode_c": 0.0, "prefill_tok_s": 0.0,
            "rmse_s": rmse, "steps": len(recs)}
