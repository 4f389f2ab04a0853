"""Speculative decoding on the engine model: a per-replica roofline of verifying ``k`` draft tokens at batch ``B`` on
Qwen3-30B-A3B (pure numpy), and what it does to the simulator's decode steps.

Cost of one decode (``k = 0``) or verify step of ``B`` running sequences, each with ``k`` draft tokens and ``ctx``
tokens of context, on one replica of ``tp`` GPUs (bf16; the probe ``../shared/probes/spec-decode-cpu``, REPORT.md
section 4, re-derived here from the model's shapes)::

    t(B, k) = t0 + max(M / (tp * BW), C / (tp * FL))
    M = dense + L * E_u * w_e + B * ctx * s_kv                  bytes read
        dense = 2.43 GB (attention + lm_head), w_e = 9.44 MB (one expert of one layer), s_kv = 98,304 B per token
        E_u = E * (1 - (1 - top/E) ** (B * (1 + rho * k)))     distinct experts a layer touches (E 128, top 8)
    C = B * (1 + k) * (2 * p_act + 4 * L * HQ * DH * ctx)       FLOPs (2 p_act = 6.06 GFLOP, 0.79 MFLOP per ctx token)

``rho`` < 1: the draft tokens of one sequence reuse part of its experts (Cohere's measurement: 4 tokens load about
2.5x the experts of one, i.e. rho ~0.6). A verify step emits ``tau`` tokens per sequence on average (the
acceptance length, bonus token included, ``1 <= tau <= k + 1``), so per token the step costs
``t(B, k) / (tau * t(B, 0))`` of a plain decode step: ``step_factor``. Break-even ``tau* = t(B, k) / t(B, 0)``.

Calibration sources (none measured here): the roofline's BW and FL are effective rates (H200 ~4.0 TB/s of 4.8
peak, H100 ~2.8 TB/s of 3.35; 600 TFLOP/s bf16 of ~990 dense peak on both), ``t0`` 1 ms per step (launch, sampler,
scheduler), ``rho`` 0.6 (Cohere: 4 tokens ~2.5x the experts, verify step 1.25x at batch 1, acceptance length 2.73),
AngelSlim's EAGLE-3 on Qwen3-30B-A3B at batch 1 (321 -> 438 tok/s at acceptance length 2.04: an implied verify
step of 1.49x), MoESD (arXiv 2505.19645: the gain peaks at medium batch). With a GPU, fit ``t0`` and ``rho`` with
vLLM's ``rejection_sample_method: "synthetic"``.

In the simulator (``recipe.sim.engine``) the factor multiplies the engine model's own decode-step time (its
``a + b * running + c * context``) for the segment's running count and mean context: the roofline gives the
*ratio*, the engine model keeps its absolute times. Drafting follows a per-batch-size schedule, as vLLM's dynamic
speculative decoding (``num_speculative_tokens_per_batch_size``) does: ``k`` draft tokens while a replica runs at
most ``max_batch`` sequences, none above (``max_batch=None``: always on).

Measured acceptance (issue 24): ``AcceptanceCurve`` is tokens per target step by position in the response, read from
``python -m recipe.sim.acceptance --json`` for one drafter and passed as ``SpecCost(curve=...)`` (``bench/
spec_measured.py``; ``python -m recipe.sim --acceptance-curve FILE --drafter D``); each segment takes
the value at its sequences' mean position (context minus the prompt), the last bucket's beyond it. That figure
counts every step, drafted or not, so ``tau`` here is tokens per step over all of a response's steps, and the steps
where the drafter found nothing verify no draft tokens: the roofline then takes the curve's mean draft tokens per
step as its ``k``.

Charged besides the roofline (each an input with its source, none measured on a GPU here):

- ``sync_penalty``: vLLM turns async scheduling off for the whole run with ngram, suffix and custom proposers
  (``config/vllm.py``), so every decode step of a speculating run, drafting or not, pays the scheduler and input
  preparation it would otherwise hide. Default 0.10 of a step: vLLM's async scheduling PR (#19970) overlaps that CPU
  work with the GPU; #32618 measured 30.8% more throughput from it on Qwen3-30B-A3B under PP4 (more CPU per step than
  our TP4 replicas), and vLLM issue #37150 measured ngram 1971 tok/s vs ngram_gpu + async 1759 (different drafters).
  10% is the middle of what those suggest for TP, a sensitivity more than a measurement.
- ``draft_s_per_token``: the CPU time of vLLM's ngram proposer, one thread, which scans each drafting request's whole
  context per step (KMP): seconds per context token, measured on this CPU with vLLM's own ``batch_propose_numba``
  (``bench/acceptance.py``: ~1.3 ns per token in the least loaded run, 1.2-3 ns on these shared cores; ~2.6 ms
  per step at 256 requests of 8000 tokens). With async scheduling off it adds to the step.
- ``draft_s_per_new_token``: a drafter that keeps a corpus (``ROLLOUT_SPECULATIVE=group``, ``recipe/drafting``)
  pays per token a request emits (its index update, then a lookup), not per context token: measured per response
  token on this CPU by ``bench/group_drafter.py``; 0 for the others.
- ``graph_penalty``: a batch-size schedule (``ROLLOUT_SPECULATIVE_MAX_BATCH``, the tail mode) makes vLLM capture
  PIECEWISE CUDA graphs instead of FULL_AND_PIECEWISE (``config/vllm.py``, the probe's notes): attention then runs
  outside the graph on every step of the run. Default 0.03 of a step, an assumption (attention launches are a few
  percent of a TP4 MoE decode step at large batch), applied to the tail mode only.

Still left out: the sampler and rejection sampler over the 152K vocabulary for ``B (1 + k)`` positions; the variance of
the accepted length (only its mean); a learned drafter's forwards (here; ``recipe.sim.draft_head`` charges an
EAGLE-3 head's, its training and memory: ``python -m recipe.sim.learned``); arctic-inference's suffix-tree update
time; Dynamic SD's limits (off with DP > 1; suffix asserts a fixed K until vLLM PR #46399).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

# Qwen3-30B-A3B
LAYERS, EXPERTS, TOP_K, HIDDEN, MOE_INTER = 48, 128, 8, 2048, 768
Q_HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4, 128, 151936
EXPERT_BYTES = 3 * HIDDEN * MOE_INTER * 2  # gate, up, down in bf16: 9.44 MB per expert per layer
_ATTN_PARAMS = LAYERS * (HIDDEN * Q_HEADS * HEAD_DIM * 2 + HIDDEN * KV_HEADS * HEAD_DIM * 2)  # q, o + k, v
DENSE_BYTES = (_ATTN_PARAMS + HIDDEN * VOCAB) * 2  # attention + lm_head: 2.43 GB (embedding rows negligible)
KV_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2  # 98,304 B of KV per context token
ACTIVE_PARAMS = _ATTN_PARAMS + LAYERS * TOP_K * 3 * HIDDEN * MOE_INTER + HIDDEN * VOCAB
FLOP_PER_TOKEN = 2 * ACTIVE_PARAMS  # 6.06 GFLOP
FLOP_PER_CTX = 4 * LAYERS * Q_HEADS * HEAD_DIM  # 0.79 MFLOP per token of context (QK^T and PV)

BANDWIDTH = {"h100": 2.8e12, "h200": 4.0e12}  # effective HBM B/s per GPU
FLOPS = {"h100": 6.0e14, "h200": 6.0e14}  # effective dense bf16 FLOP/s per GPU
# Acceptance lengths published for this model class (tokens per verify step, bonus included)
PUBLISHED_ACCEPTANCE = {"angelslim-eagle3": 2.04, "cohere": 2.73}
MODES = ("off", "tail", "always")
SYNC_PENALTY = 0.10  # async scheduling off (vLLM PRs #19970, #32618; issue #37150): see the docstring
DRAFT_S_PER_TOKEN = 1.3e-9  # vLLM's ngram proposer on this CPU, one thread (bench/acceptance.py)
GRAPH_PENALTY = 0.03  # PIECEWISE instead of FULL_AND_PIECEWISE CUDA graphs under a batch-size schedule (assumed)


def experts_touched(tokens) -> np.ndarray:
    """Expected distinct experts one layer routes ``tokens`` (effective) tokens to: E [1 - (1 - top/E)^tokens]."""
    return EXPERTS * (1.0 - (1.0 - TOP_K / EXPERTS) ** np.asarray(tokens, dtype=np.float64))


@dataclass(frozen=True)
class AcceptanceCurve:
    """Measured tokens per target step (every step counted) and draft tokens per step, by the position in the response
    where a step starts (``starts`` ascending from 0; the last value holds beyond), for one drafter."""

    starts: tuple
    tau: tuple
    drafted: tuple
    source: str = ""

    def __post_init__(self):
        if not (len(self.starts) == len(self.tau) == len(self.drafted) >= 1) or self.starts[0] != 0:
            raise ValueError("an acceptance curve needs equal-length starts (from 0), tau and drafted")
        if any(t < 1 for t in self.tau) or any(d < 0 for d in self.drafted):
            raise ValueError(f"tokens per step must be >= 1 and draft tokens >= 0, got {self.tau}, {self.drafted}")

    @classmethod
    def from_report(cls, report: dict, drafter: str, source: str = "") -> AcceptanceCurve:
        """From ``python -m recipe.sim.acceptance --json``'s object (or ``bench/acceptance.py --json-out``'s
        ``drafters``): buckets without steps take the bucket before. An entry without ``by_position`` is a summary
        (``tokens_per_step`` and ``draft_tokens_per_step``, ``recipe/sim/curves``): held flat."""
        report = report.get("drafters", report)
        if drafter not in report:
            raise ValueError(f"drafter {drafter!r} is not in the acceptance report; it has {sorted(report)}")
        s = report[drafter]
        if "by_position" not in s:
            if "tokens_per_step" not in s or "draft_tokens_per_step" not in s:
                raise ValueError(f"drafter {drafter!r}: a summary entry needs tokens_per_step and "
                                 "draft_tokens_per_step")
            return cls((0,), (s["tokens_per_step"],), (s["draft_tokens_per_step"],), source or drafter)
        if not s.get("groups"):
            raise ValueError(f"drafter {drafter!r} has no measurement ({s.get('skipped', 'no groups')})")
        overall_draft = s["draft_tokens"] / s["steps"]
        starts, tau, drafted = [], [], []
        for b in s["by_position"]:
            starts.append(b["from"])
            tau.append(b["tokens_per_step"] if b["tokens_per_step"] is not None else (tau[-1] if tau else
                                                                                      s["tokens_per_step"]))
            dr = b.get("draft_tokens_per_step", overall_draft)
            drafted.append(dr if dr is not None else (drafted[-1] if drafted else overall_draft))
        return cls(tuple(starts), tuple(tau), tuple(drafted), source or drafter)

    def mixed(self, other: AcceptanceCurve, share: float, source: str) -> AcceptanceCurve:
        """This curve for ``share`` of the tokens and ``other`` for the rest, position by position (the group
        drafter with history where the engine has it, without elsewhere: ``recipe/sim/corpus_limits.py``)."""
        if not 0 <= share <= 1:
            raise ValueError(f"share={share} must lie in [0, 1]")
        starts = tuple(sorted(set(self.starts) | set(other.starts)))
        (t1, d1), (t0, d0) = self.at(starts), other.at(starts)
        return AcceptanceCurve(starts, tuple((share * t1 + (1 - share) * t0).tolist()),
                               tuple((share * d1 + (1 - share) * d0).tolist()), source)

    def at(self, position) -> tuple[np.ndarray, np.ndarray]:
        """(tau, draft tokens per step) at ``position`` (array) in the response."""
        i = np.searchsorted(np.asarray(self.starts), np.maximum(np.asarray(position, dtype=np.float64), 0),
                            side="right") - 1
        return np.asarray(self.tau)[i], np.asarray(self.drafted)[i]


@dataclass(frozen=True)
class SpecCost:
    """The roofline of one replica (see the module docstring); ``tau`` the acceptance length at ``k`` drafts."""

    tau: float = PUBLISHED_ACCEPTANCE["angelslim-eagle3"]
    k: int = 3
    rho: float = 0.6
    t0: float = 1e-3
    bandwidth: float = BANDWIDTH["h200"]
    flops: float = FLOPS["h200"]
    tp: int = 4
    # Added to every decode step of a run that speculates, drafting or not (async scheduling off; see the docstring)
    sync_penalty: float = SYNC_PENALTY
    draft_s_per_token: float = DRAFT_S_PER_TOKEN  # CPU drafting seconds per context token of a drafting sequence
    # CPU seconds per token a drafting sequence emits: a corpus updated as text arrives (the group drafter,
    # bench/group_drafter.py) instead of a scan of the context
    draft_s_per_new_token: float = 0.0
    graph_penalty: float = GRAPH_PENALTY  # every step of a run with a batch-size schedule (tail mode)
    # Drafts of 0..K tokens per request (a corpus or lookup drafter): vLLM's uniform-decode FULL graphs do not apply
    # to a step whose requests verify different numbers of tokens, so graph_penalty is paid on every step
    ragged_drafts: bool = False
    # The group drafter routes whole GRPO groups to one replica (recipe/adapter/router.py): the executor places a
    # speculating policy's requests by group, paying affinity's load imbalance (bench/group_affinity.py)
    group_affinity: bool = False
    curve: AcceptanceCurve | None = None  # measured acceptance by position: replaces tau and k where given
    prompt_len: int = 256  # context minus this is the curve's position (EngineParams.prompt_len's default)

    def __post_init__(self):
        if self.k < 1 or self.tp < 1:
            raise ValueError(f"speculation needs k >= 1 draft tokens and tp >= 1, got k={self.k}, tp={self.tp}")
        if self.curve is None and not 1.0 <= self.tau <= self.k + 1:
            raise ValueError(f"acceptance length tau={self.tau} must lie in [1, k + 1 = {self.k + 1}]")
        if (not 0 <= self.rho <= 1 or self.t0 < 0 or self.bandwidth <= 0 or self.flops <= 0 or self.sync_penalty < 0
                or self.draft_s_per_token < 0 or self.draft_s_per_new_token < 0 or self.graph_penalty < 0):
            raise ValueError("rho must lie in [0, 1], t0 >= 0, bandwidth and flops > 0, sync_penalty, "
                             "draft_s_per_token and draft_s_per_new_token >= 0")

    @classmethod
    def for_gpu(cls, gpu: str, **kw) -> SpecCost:
        if gpu not in BANDWIDTH:
            raise ValueError(f"gpu {gpu!r} is not one of {sorted(BANDWIDTH)}")
        return cls(bandwidth=BANDWIDTH[gpu], flops=FLOPS[gpu], **kw)

    def step_time(self, batch, k, ctx) -> np.ndarray:
        """t(B, k): seconds of one step of ``batch`` sequences verifying ``k`` draft tokens each at ``ctx`` tokens of
        context (arrays broadcast)."""
        b = np.asarray(batch, dtype=np.float64)
        k = np.asarray(k, dtype=np.float64)
        ctx = np.asarray(ctx, dtype=np.float64)
        mem = DENSE_BYTES + LAYERS * experts_touched(b * (1.0 + self.rho * k)) * EXPERT_BYTES + b * ctx * KV_BYTES
        flop = b * (1.0 + k) * (FLOP_PER_TOKEN + FLOP_PER_CTX * ctx)
        return self.t0 + np.maximum(mem / (self.tp * self.bandwidth), flop / (self.tp * self.flops))

    def break_even(self, batch, ctx, k: int | None = None) -> np.ndarray:
        """Acceptance length at which verifying ``k`` drafts is as fast as plain decoding: t(B, k) / t(B, 0)."""
        k = self.k if k is None else k
        return self.step_time(batch, k, ctx) / self.step_time(batch, 0, ctx)

    def speedup(self, batch, ctx) -> np.ndarray:
        """Tokens per second with speculation over without, at one batch, by the roofline alone: tau t(B, 0) /
        t(B, k)."""
        return self.tau / self.break_even(batch, ctx)


@dataclass(frozen=True)
class Speculation:
    """What the engine model applies: the cost model plus the drafting schedule (``max_batch``: draft only while a
    replica runs at most that many sequences; None: always)."""

    cost: SpecCost
    max_batch: int | None = None

    def factor(self, running, ctx_mean) -> np.ndarray:
        """Per decode token, the time of a speculative step over a plain one (1 where the schedule does not draft,
        times the penalties every step of the run pays)."""
        r = np.maximum(np.asarray(running, dtype=np.float64), 1.0)
        ctx = np.asarray(ctx_mean, dtype=np.float64)
        c = self.cost
        if c.curve is None:
            tau, k = c.tau, c.k
        else:
            tau, k = c.curve.at(ctx - c.prompt_len)
        plain = self.cost.step_time(r, 0, ctx)
        draft_cpu = self.cost.draft_s_per_token * r * ctx + self.cost.draft_s_per_new_token * r * tau
        f = (self.cost.step_time(r, k, ctx) + draft_cpu) / (tau * plain)
        if self.max_batch is not None:
            f = np.where(r <= self.max_batch, f, 1.0)
        every = 1.0 + c.sync_penalty + (c.graph_penalty if self.max_batch is not None or c.ragged_drafts else 0.0)
        return np.asarray(f, dtype=np.float64) * every

    def min_factor(self) -> float:
        """The smallest factor at any batch and context (for the lower bounds): below it no step can go."""
        grid_b = np.arange(1, 513, dtype=np.float64)
        ctx = np.array([0.0, 2e4])[None, :] + self.cost.prompt_len
        if self.cost.curve is not None:
            starts = np.asarray(self.cost.curve.starts, dtype=np.float64)[None, :]
            ctx = np.concatenate([ctx, starts + self.cost.prompt_len], axis=1)
        f = self.factor(grid_b[:, None], ctx)
        return float(min(1.0, f.min()))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self.cost), "max_batch": self.max_batch}


def acceptance_rate(tau: float, k: int) -> float:
    """Per-token acceptance alpha with (1 - alpha^(k+1)) / (1 - alpha) = tau (i.i.d. acceptance), by bisection."""
    if not 1.0 <= tau <= k + 1:
        raise ValueError(f"tau={tau} must lie in [1, {k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        val = (k + 1) if mid == 1.0 else (1 - mid ** (k + 1)) / (1 - mid)
        lo, hi = (mid, hi) if val < tau else (lo, mid)
    return (lo + hi) / 2


def expected_acceptance(alpha: float, k: int) -> float:
    """Acceptance length of ``k`` drafts at per-token acceptance ``alpha``: (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def needed_tau(speedup_at, target: float, lo: float = 1.0, hi: float = 4.0, tol: float = 0.01) -> float | None:
    """Smallest acceptance length in [lo, hi] where ``speedup_at(tau)`` (increasing) reaches ``target``, by
    bisection to ``tol``; None when even ``hi`` does not."""
    if speedup_at(hi) < target:
        return None
    if speedup_at(lo) >= target:
        return lo
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup_at(mid) < target else (lo, mid)
    return round(hi, 3)


__all__ = ["SpecCost", "Speculation", "AcceptanceCurve", "MODES", "PUBLISHED_ACCEPTANCE", "acceptance_rate",
           "expected_acceptance",
           "needed_tau", "experts_touched"]
