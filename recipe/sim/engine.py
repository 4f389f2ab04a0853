"""A continuous-batching rollout engine model: how long one synchronous GRPO step takes for given response lengths.

Model (per rollout replica, e.g. 4 replicas of TP4 on 16 GPUs):

* All requests of a step are submitted at t=0 (verl's agent-loop workers gather every row of the batch at once).
  verl 0.9.1 routes each request with ``GlobalRequestLoadBalancer``: least in-flight requests, ties broken at
  random. With every request arriving before any finishes, that deals requests in rounds of ``replicas``, each
  round to a random permutation of the replicas; that is what ``assign_replicas`` does. ``assign_by_predicted``
  is the alternative the issue asks about: each request to the replica with the fewest predicted outstanding tokens.
* A replica runs at most ``max_num_seqs`` sequences (vLLM continuous batching). Waiting requests are admitted in
  arrival order (``fcfs``) or, when the step passes per-request priorities (vLLM ``scheduling_policy=priority``),
  by ``(priority, arrival)``, lower first. A finished sequence frees its slot at once and the next waiting request
  starts (after its prefill).
* One decode step advances every running sequence by one token and takes ``a + b * running + c * context``, where
  ``context`` is the sum of prompt + generated tokens of the running sequences (the KV read). A request starting
  with ``context0`` tokens (the prompt, plus the partial response when a partial rollout resumes it) first costs
  ``prefill_tok_s * context0``; prefill stalls the replica's decoding (a simplification of chunked prefill).
* KV cache (``kv_tokens`` per replica, in blocks of ``block_size`` tokens), as vLLM v1's scheduler
  (``vllm/v1/core/sched/scheduler.py``) does it: a sequence of ``t`` tokens holds ``ceil(t / block_size)`` blocks;
  a waiting request is admitted only when its whole context (prompt + tokens generated before a preemption) fits
  in the free blocks (``scheduler_reserve_full_isl``), and admission stops at the first request that does not fit
  (no skipping ahead); when the running sequences cannot all grow by one token, the scheduler preempts (FCFS: the
  running request admitted last; priority: the running request with the largest ``(priority, arrival)``) until they
  can, frees the victim's blocks and puts it back at the front of the waiting queue (FCFS) or into the priority
  queue; nothing is admitted in a step that preempted. A preempted request keeps its tokens and re-prefills prompt +
  generated tokens when re-admitted (preemption by recompute, vLLM v1's only mode). Simplifications: the admission
  check asks for the blocks of the request's first decode step too (vLLM admits on the prefill's blocks and may
  preempt it one step later), the watermark is vLLM's default 0, there is no prefix caching (verl resets it after
  each weight update) and no chunked-prefill token budget.

``kv_tokens`` defaults (``kv_tokens_per_replica``, derived, not tuned): per GPU vLLM takes ``gpu_memory_utilization``
of the memory the driver reports (0.6: ``ROLLOUT_GPU_MEMORY_UTILIZATION`` in ``scripts/train_grpo.sh``), minus its
shard of the bf16 weights (Qwen3-30B-A3B: ~30.5e9 parameters x 2 bytes / TP), minus ~2 GiB for the profiling run's
activation peak, CUDA graphs and NCCL buffers (an estimate); the rest holds KV. A token's KV is 48 layers x 2 (K, V)
x 4 KV heads x 128 x 2 bytes = 96 KiB, split over TP4 as one KV head per GPU (24 KiB per GPU). H100 80 GB
(81559 MiB): 0.6 x 79.6 - 14.2 - 2 = 31.6 GiB per GPU -> ~1.38M tokens per TP4 replica; H200 (143771 MiB): 68.0 GiB
-> ~2.97M. At 128 requests per replica (batch 32 x n=16 over 4 replicas) a step holds (running sequences x their
context) tokens: typically 0.3-0.5M at the peak, the worst case 128 x 16.6k = 2.1M. ``--kv-tokens`` overrides.

Speculative decoding (``simulate_step(..., speculation=)``, ``recipe.sim.speculation``): each segment's decode time
is multiplied by the roofline's per-token factor for its running count and mean context (verify steps emit the
acceptance length per sequence); prefill is unchanged.

The simulation is exact for this model. Without KV pressure it is vectorised: starts/finishes are computed in
"token clock" units (decode steps), and between two consecutive start/finish events the running set is fixed, so
the time of the whole segment is a closed-form sum (one step of 512 requests costs well under a millisecond per
replica). A replica whose schedule would need more KV blocks than it has at some point is re-simulated event by
event (admission, finish, preemption; the next preemption point found by bisection on the block demand), a few ms.

Default time parameters are estimates for Qwen3-30B-A3B (3B active, bf16, 48 layers, 4 KV heads x 128) on
H100/H200 TP4 replicas, not measurements: ~10 ms per decode step at small batch (a; single-stream MoE decode with
TP4 all-reduces is ~80-120 tokens/s on H100-class GPUs), ~0.08 ms per extra running sequence (b; expert and
attention compute), KV read ~5e-9 s per context token (c; 96 KiB/token spread over 4 GPUs at ~3-4 TB/s effective).
At 128 sequences with 6k tokens of context each a step then takes ~24 ms: ~5k tokens/s per replica, ~21k for 16
GPUs. The same a, b, c are used for H100 and H200 (only the KV capacity differs): replace them with ``fit_engine``
on measured steps when you have them.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .routing import route_requests

MIB = 2**20
GIB = 2**30
GPU_MEMORY_BYTES = {"h100": 81559 * MIB, "h200": 143771 * MIB}  # total memory as nvidia-smi reports it
MODEL_PARAMS = 30.5e9  # Qwen3-30B-A3B, bf16
MODEL_KV_HEADS = 4
KV_BYTES_PER_TOKEN = 48 * 2 * MODEL_KV_HEADS * 128 * 2  # layers x (K, V) x KV heads x head_dim x bf16 = 96 KiB
NON_KV_OVERHEAD_BYTES = 2 * GIB  # per GPU: activation peak of vLLM's profiling run, CUDA graphs, NCCL (estimate)
GPU_MEMORY_UTILIZATION = 0.6  # scripts/train_grpo.sh ROLLOUT_GPU_MEMORY_UTILIZATION
PLACEMENTS = ("least_inflight", "predicted_tokens", "group")


def kv_tokens_per_replica(gpu: str = "h100", *, tp: int = 4,
                          gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> int:
    """KV-cache tokens one TP replica of Qwen3-30B-A3B holds (see the module docstring for the derivation)."""
    if gpu not in GPU_MEMORY_BYTES:
        raise ValueError(f"gpu {gpu!r} is not one of {sorted(GPU_MEMORY_BYTES)} (or pass kv_tokens directly)")
    if tp < 1 or not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"tp must be >= 1 and gpu_memory_utilization in (0, 1], got {tp}, {gpu_memory_utilization}")
    free = gpu_memory_utilization * GPU_MEMORY_BYTES[gpu] - 2 * MODEL_PARAMS / tp - NON_KV_OVERHEAD_BYTES
    if free <= 0:
        raise ValueError(f"{gpu} x TP{tp} at gpu_memory_utilization {gpu_memory_utilization}: the weights do not fit")
    heads_per_gpu = max(1, MODEL_KV_HEADS // tp)  # TP beyond the KV heads replicates them
    return int(free // (KV_BYTES_PER_TOKEN * heads_per_gpu / MODEL_KV_HEADS))


KV_TOKENS = {gpu: kv_tokens_per_replica(gpu) for gpu in GPU_MEMORY_BYTES}


@dataclass(frozen=True)
class EngineParams:
    replicas: int = 4  # 16 GPUs as 4 x TP4
    max_num_seqs: int = 256  # verl 0.9.1 rollout.yaml default
    decode_a: float = 0.010  # s per decode step (weights, launch, all-reduce)
    decode_b: float = 8e-5  # s per running sequence per decode step
    decode_c: float = 5e-9  # s per context token per decode step (KV read)
    prefill_tok_s: float = 1e-5  # s per prefilled token (~100k tokens/s per replica)
    prompt_len: int = 256  # prompt tokens per request
    kv_tokens: int | None = KV_TOKENS["h100"]  # KV-cache capacity per replica (None: unbounded)
    block_size: int = 16  # vLLM's KV block size on GPU

    def __post_init__(self):
        if self.replicas < 1 or self.max_num_seqs < 1 or self.block_size < 1:
            raise ValueError("replicas, max_num_seqs and block_size must be >= 1")
        times = (self.decode_a, self.decode_b, self.decode_c, self.prefill_tok_s)
        if min(times) < 0 or self.decode_a + self.decode_b <= 0:
            raise ValueError("engine time parameters must be >= 0 and a decode step must take time")
        if self.kv_tokens is not None and self.kv_tokens < self.block_size:
            raise ValueError(f"kv_tokens={self.kv_tokens} holds no block of {self.block_size} tokens")

    @property
    def kv_blocks(self) -> int | None:
        return None if self.kv_tokens is None else self.kv_tokens // self.block_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def assign_replicas(num_requests: int, replicas: int, rng: np.random.Generator) -> np.ndarray:
    """Replica of each request in submission order: least in-flight with random ties (verl 0.9.1)."""
    rounds = -(-num_requests // replicas)
    return np.argsort(rng.random((rounds, replicas)), axis=1).ravel()[:num_requests]


def assign_by_predicted(predicted, replicas: int, rng: np.random.Generator) -> np.ndarray:
    """Replica of each request in submission order: the one with the fewest predicted outstanding tokens (the sum
    of the predictions of the requests it was given; every request of a step is in flight at once), random ties."""
    pred = np.asarray(predicted, dtype=np.float64)
    load = np.zeros(replicas)
    tie = rng.random((len(pred), replicas))
    out = np.empty(len(pred), np.int64)
    for i, x in enumerate(pred):
        k = int(np.lexsort((tie[i], load))[0])
        out[i] = k
        load[k] += x
    return out


def fifo_starts(lengths: np.ndarray, slots: int) -> np.ndarray:
    """Token clock at which each request starts on one replica (admitted in the given order, a slot frees when its
    sequence ends)."""
    starts = np.zeros(len(lengths), np.int64)
    if len(lengths) > slots:
        free = [int(x) for x in lengths[:slots]]
        heapq.heapify(free)
        for j in range(slots, len(lengths)):
            t = heapq.heappop(free)
            starts[j] = t
            heapq.heappush(free, t + int(lengths[j]))
    return starts


def admission_order(n: int, priority=None) -> np.ndarray:
    """Indices in the order a replica admits them: arrival (FCFS), or ``(priority, arrival)`` (vLLM priority)."""
    if priority is None:
        return np.arange(n)
    return np.lexsort((np.arange(n), np.asarray(priority, dtype=np.float64)))


class ReplicaTimeline:
    """The exact schedule of one replica for one step: per-request finish and wall-clock times, preemptions."""

    def __init__(self, lengths: np.ndarray, context0: np.ndarray, p: EngineParams, priority=None,
                 speculation=None):
        self.speculation = speculation  # recipe.sim.speculation.Speculation: per-token time factor of a segment
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.size and self.lengths.min() < 1:
            raise ValueError("every request generates at least one token")
        self.p = p
        self.context0 = np.asarray(context0, dtype=np.int64)
        self.priority = None if priority is None else np.asarray(priority, dtype=np.float64)
        self.num_preempted = np.zeros(len(self.lengths), np.int64)
        self.recomputed_tokens = 0  # prefill tokens spent again on preempted requests
        self._segments: list | None = None  # the event-by-event schedule, when KV pressure needed one
        order = admission_order(len(self.lengths), self.priority)
        start = np.empty(len(self.lengths), np.int64)
        start[order] = fifo_starts(self.lengths[order], p.max_num_seqs)
        self.start = start
        self._closed_form()
        if p.kv_blocks is not None and self.peak_blocks > p.kv_blocks:
            self._event_driven(order)

    # -- no KV pressure: the vectorised closed form ----------------------------------------------------------------
    def _closed_form(self) -> None:
        p = self.p
        finish = self.start + self.lengths
        ev = np.unique(np.concatenate([[0], self.start, finish]))  # token-clock event points
        ks, kf = np.searchsorted(ev, self.start), np.searchsorted(ev, finish)
        k = len(ev)
        n_start = np.bincount(ks, minlength=k)
        offset = self.context0.astype(np.float64) - self.start  # context at clock t is offset + t
        running = np.cumsum(n_start - np.bincount(kf, minlength=k))
        ctx0 = np.cumsum(np.bincount(ks, offset, k) - np.bincount(kf, offset, k))  # sum of offsets while running
        d = np.diff(ev).astype(np.float64)
        e0, r, a0 = ev[:-1].astype(np.float64), running[:-1].astype(np.float64), ctx0[:-1]
        # Segment k: d steps with r running; the context sum at step t is a0 + r * t.
        seg = d * (p.decode_a + p.decode_b * r) + p.decode_c * (d * a0 + r * (d * e0 + d * (d - 1) / 2))
        f = self._spec_factor(r, np.where(r > 0, (a0 + r * e0) / np.maximum(r, 1.0), 0.0))
        seg = np.where(r > 0, seg * f, 0.0)
        prefill = np.cumsum(np.bincount(ks, p.prefill_tok_s * self.context0.astype(np.float64), k))
        seg_cum = np.concatenate([[0.0], np.cumsum(seg)])
        self._ev, self._r, self._a0, self._f = ev, r, a0, f
        self._seg_start = seg_cum[:-1] + prefill[:-1]  # wall time when segment k starts decoding
        reach = seg_cum + np.concatenate([[0.0], prefill[:-1]])  # wall time when the clock reaches ev[k]
        self.finish_time = reach[kf]
        self.time_s = float(reach[-1]) if self.lengths.size else 0.0
        # Blocks the last decode step of each segment needs, bounded above (each sequence rounds up at most one
        # block): context sum a0 + r * ev[k+1] over block_size, plus r.
        need = (a0 + r * ev[1:]) / p.block_size + r
        self.peak_blocks = float(need.max()) if len(need) else 0.0

    def _spec_factor(self, running: np.ndarray, ctx_mean: np.ndarray) -> np.ndarray:
        """Per-token time of a segment with ``running`` sequences at ``ctx_mean`` context over a plain decode step:
        1 without speculation (``recipe.sim.speculation``: verify steps emit the acceptance length per sequence)."""
        if self.speculation is None:
            return np.ones(len(running))
        return self.speculation.factor(running, ctx_mean)

    # -- KV pressure: admission and preemption event by event ------------------------------------------------------
    def _event_driven(self, order: np.ndarray) -> None:
        p, bs, cap = self.p, self.p.block_size, self.p.kv_blocks
        n, todo, ctx0 = len(self.lengths), self.lengths, self.context0
        prio = self.priority
        gen = np.zeros(n, np.int64)
        finish = np.full(n, np.nan)
        fcfs = prio is None
        waiting: deque | list = deque(order.tolist()) if fcfs else [(prio[i], i) for i in order.tolist()]
        if not fcfs:
            heapq.heapify(waiting)
        running: list[int] = []
        segments = []  # (wall start, alpha, beta, steps, generated at start, running indices)
        t = 0.0

        def blocks(idx, extra: int = 1):  # blocks for each request's next decode step
            return -(-(ctx0[idx] + gen[idx] + extra) // bs)

        while True:
            preempted = False
            need = int(blocks(np.array(running, np.int64)).sum()) if running else 0
            while need > cap:  # preempt until the running sequences can all grow by one token
                if fcfs:
                    v = running.pop()
                else:
                    v = max(running, key=lambda i: (prio[i], i))
                    running.remove(v)
                need -= int(blocks(np.array([v]))[0])
                self.num_preempted[v] += 1
                if fcfs:
                    waiting.appendleft(v)
                else:
                    heapq.heappush(waiting, (prio[v], v))
                preempted = True
            while not preempted and waiting and len(running) < p.max_num_seqs:
                h = waiting[0] if fcfs else waiting[0][1]
                want = int(blocks(np.array([h]))[0])
                if need + want > cap:
                    break
                if fcfs:
                    waiting.popleft()
                else:
                    heapq.heappop(waiting)
                running.append(h)
                need += want
                t += p.prefill_tok_s * float(ctx0[h] + gen[h])
                if gen[h] > 0:
                    self.recomputed_tokens += int(ctx0[h] + gen[h])
            if not running:
                if waiting:
                    h = waiting[0] if fcfs else waiting[0][1]
                    raise ValueError(f"kv_tokens={p.kv_tokens} cannot hold one request of {int(ctx0[h] + todo[h])}"
                                     " tokens: raise kv_tokens (--kv-tokens) or lower the lengths")
                break
            idx = np.array(running, np.int64)
            r = len(idx)
            steps = int((todo[idx] - gen[idx]).min())  # until the next finish ...
            if int(blocks(idx, steps).sum()) > cap:  # ... or the first step whose blocks do not fit
                lo, hi = 1, steps  # blocks(idx, lo) fits, blocks(idx, hi) does not
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if int(blocks(idx, mid).sum()) <= cap else (lo, mid)
                steps = lo
            s0 = float((ctx0[idx] + gen[idx]).sum())
            beta = p.decode_c * r / 2
            alpha = p.decode_a + p.decode_b * r + p.decode_c * s0 - beta
            f = float(self._spec_factor(np.array([r]), np.array([s0 / r]))[0])
            alpha, beta = alpha * f, beta * f
            segments.append((t, alpha, beta, steps, gen.copy(), idx))
            t += alpha * steps + beta * steps * steps
            gen[idx] += steps
            done = idx[gen[idx] == todo[idx]]
            finish[done] = t
            if len(done):
                gone = set(done.tolist())
                running = [i for i in running if i not in gone]
        self.finish_time = finish
        self.time_s = t if n else 0.0
        self._segments = segments
        self._seg_start = np.array([s[0] for s in segments])

    def tokens_by(self, t: float) -> np.ndarray:
        """Tokens each request has generated by wall time ``t`` (an abort at ``t`` keeps these)."""
        if t >= self.time_s:
            return self.lengths.copy()
        k = int(np.searchsorted(self._seg_start, t, side="right")) - 1
        if k < 0:
            return np.zeros_like(self.lengths)
        if self._segments is not None:
            start, alpha, beta, steps, gen, idx = self._segments[k]
            out = gen.copy()
            out[idx] += min(_steps_within(t - start, alpha, beta), steps)
            return out
        p, r, e0 = self.p, self._r[k], float(self._ev[k])
        # Elapsed after j steps of segment k: alpha * j + beta * j**2 (quadratic through the context term).
        beta = p.decode_c * r / 2
        alpha = p.decode_a + p.decode_b * r + p.decode_c * (self._a0[k] + r * e0) - beta
        alpha, beta = alpha * self._f[k], beta * self._f[k]
        clock = e0 + min(_steps_within(t - self._seg_start[k], alpha, beta), int(self._ev[k + 1] - e0))
        return np.clip(clock - self.start, 0, self.lengths)


def _steps_within(dt: float, alpha: float, beta: float) -> int:
    """Whole decode steps completed ``dt`` seconds into a segment whose j-th step ends at alpha * j + beta * j**2."""
    j = dt / alpha if beta == 0 else (-alpha + math.sqrt(alpha * alpha + 4 * beta * dt)) / (2 * beta)
    return max(0, math.floor(j + 1e-9))


@dataclass
class StepTiming:
    """One step over all replicas: request ``i`` ran on ``replica[i]`` and finished at ``finish_time[i]``."""

    replica: np.ndarray
    finish_time: np.ndarray
    time_s: float
    timelines: list[ReplicaTimeline]
    num_preempted: np.ndarray  # per request: times vLLM preempted it (KV cache full)
    recomputed_tokens: int = 0  # prefill tokens spent again re-admitting preempted requests

    def tokens_by(self, t: float) -> np.ndarray:
        out = np.zeros(len(self.replica), np.int64)
        for rep, tl in enumerate(self.timelines):
            out[self.replica == rep] = tl.tokens_by(t)
        return out


def simulate_step(lengths, p: EngineParams, rng: np.random.Generator, context0=None, priority=None,
                  predicted=None, placement: str = "least_inflight", speculation=None, groups=None) -> StepTiming:
    """Time one step whose requests (in submission order) generate ``lengths`` tokens each, starting from
    ``context0`` tokens of context (default: the prompt). ``priority`` (lower first, vLLM's convention) switches
    the replicas to priority scheduling; ``placement="predicted_tokens"`` routes by ``predicted`` outstanding
    tokens instead of verl's least in-flight count, ``placement="group"`` by ``groups`` (each request's dataset row)
    as the recipe's group-affinity router does (``recipe.sim.routing``: homes, the per-request guard, its splits).
    ``speculation`` (``recipe.sim.speculation.Speculation``): draft
    and verify by its schedule, each segment's decode time scaled by its factor."""
    lengths = np.asarray(lengths, dtype=np.int64).ravel()
    ctx = np.full(len(lengths), p.prompt_len) if context0 is None else np.asarray(context0).ravel()
    prio = None if priority is None else np.asarray(priority, dtype=np.float64).ravel()
    if placement == "least_inflight":
        replica = assign_replicas(len(lengths), p.replicas, rng)
    elif placement == "group":
        if groups is None:
            raise ValueError("placement 'group' needs the group of every request")
        replica = route_requests(groups, p.replicas, rng=rng)
    elif placement == "predicted_tokens":
        if predicted is None:
            raise ValueError("placement 'predicted_tokens' needs the predicted tokens of every request")
        replica = assign_by_predicted(np.asarray(predicted, dtype=np.float64).ravel(), p.replicas, rng)
    else:
        raise ValueError(f"placement {placement!r} is not one of {PLACEMENTS}")
    finish = np.zeros(len(lengths))
    preempted = np.zeros(len(lengths), np.int64)
    timelines = []
    for rep in range(p.replicas):
        idx = np.flatnonzero(replica == rep)
        tl = ReplicaTimeline(lengths[idx], ctx[idx], p, None if prio is None else prio[idx], speculation)
        finish[idx] = tl.finish_time
        preempted[idx] = tl.num_preempted
        timelines.append(tl)
    return StepTiming(replica=replica, finish_time=finish, time_s=max([0.0, *(tl.time_s for tl in timelines)]),
                      timelines=timelines, num_preempted=preempted,
                      recomputed_tokens=sum(tl.recomputed_tokens for tl in timelines))


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
