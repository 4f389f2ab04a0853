"""A learned drafter (an EAGLE-3 head) on the speculation roofline: its forward cost per drafted token, its training
cost and memory, its acceptance by depth and by policy drift, and the depth schedule by live batch size (pure numpy).

**Cost of drafting** (per target step of ``B`` sequences at ``ctx`` tokens of context, on the target's TP group, as
vLLM runs the head at the target's TP): ``k`` forwards of one decoder layer plus the draft-vocabulary ``lm_head``,
each on the same roofline as the target (``SpecCost``: effective bandwidth and FLOP/s of the modelled GPU)::

    d(B, ctx, n) = t0_draft + max((2 (P_layer + P_lm) + B ctx s_kv') / (tp BW), B n (2 (P_layer + P_lm)
                   + 4 HQ DH ctx) / (tp FL))
    D(B, k) = d_fc(B, ctx, tau) + (k - 1) d(B, ctx, 1)     (the first forward runs the tau tokens the verify step
                                                             kept, through ``fc`` too: P_fc more parameters)

The head's shape follows the target (Qwen3-30B-A3B: hidden 2048, 32 query / 4 KV heads of 128, intermediate 6144,
as SpecForge's configs copy the target's, e.g. its qwen3-32b-eagle3.json), one Llama decoder layer whose attention
reads [embedding; hidden] (2 x 2048 in), ``fc`` 3 x 2048 -> 2048 over three aux layers, a 32,000-token draft
vocabulary (SpecForge and speculators default): ~146M parameters, 0.29 GB in bf16, 2 KiB of KV per token (one
layer) against the target's 96 KiB. ``t0_draft`` 0.1 ms per forward (launch and TP all-reduce of one layer inside a
CUDA graph): an assumption, the value that reconciles AngelSlim's published step on Qwen3-30B-A3B at batch 1 (321
-> 438 tok/s at acceptance 2.04, a 1.49x step) with the H200 roofline at k = 3.

**Acceptance** (the standard EAGLE chain model): a chain of ``k`` greedy drafts, each position ``i`` accepted with
conditional probability ``a_i`` given all before it, emits ``tau(k) = 1 + sum_{i<=k} prod_{j<=i} a_j`` tokens per
step (bonus included). Per sequence it does not depend on the batch (point-mass drafts, one chain each); it falls
with batch size only through the schedule's shallower depth there. Beyond the positions a source gives, the last
ratio of consecutive rates continues (flat for a flat source). Published figures, named as published (both at batch
1, presumably greedy: RL samples at T = 1, where a point-mass draft is accepted with p(draft), lower):

- ``MATH_HEAD``: AQ-MedAI/Qwen3.5-397B-A17B-eagle3 (model card): 3.40 tokens per step on GSM8K, 3.53 on MATH-500
  at batch 1; the card gives no depth: k = 3 is assumed (vLLM's usual ``num_speculative_tokens`` for EAGLE-3), with
  flat per-position rates (EAGLE-3's training-time test keeps later positions near the first): a = 0.905.
- ``CHAT_HEAD``: Ichigec/a1-agents-eagle3-speculator (model card): a head trained on 5,000 ShareGPT samples alone,
  per-position accuracy 71.4 / 42.7 / 25.7% at k = 3 (2.10 tokens per step read as conditional rates; the card says
  2.02).

**Drift** (an assumption until the CPU run of issue 44 item 5 measures it): a head made for policy version ``v``,
used at version ``v + lag``, has rates ``w a_head + (1 - w) min(a_head, a_chat)`` with ``w = 2 ** (-lag /
half_life)``: it forgets the policy's distribution toward what a head knows from generic text (never gaining). A
frozen head's lag is the RL step; an online head's is 1 (trained after the actor update on the step's hidden
states, synced with the policy) or 2 (trained on GPUs idle in the next step's tail on the previous step's states).

**Training** (per RL step, on the step's tokens, at most ``opt_steps x tokens_per_opt_step``): ``6 P ttt`` FLOPs
per token (forward and backward of the head, unrolled ``ttt`` positions by EAGLE-3's training-time test; the
target's hidden states come from the old-log-prob forward the trainer runs anyway) at ``mfu`` of the GPUs' effective
FLOP/s. Memory: bf16 weights in every replica (and its KV), fp32 master weights plus Adam's moments and the
gradient (16 B per parameter) on the trainer, and the aux hidden states of the trained tokens (12 KiB each).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .speculation import HEAD_DIM, HIDDEN, KV_BYTES, KV_HEADS, Q_HEADS, VOCAB, SpecCost

K_MAX = 8  # deepest chain the schedule considers


@dataclass(frozen=True)
class DraftHead:
    """An EAGLE-3 head's shape and its per-forward overhead (defaults: one for Qwen3-30B-A3B; see the docstring)."""

    hidden: int = HIDDEN
    q_heads: int = Q_HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM
    intermediate: int = 6144
    draft_vocab: int = 32000
    aux_layers: int = 3
    t0: float = 1e-4  # s per draft forward (launch, TP all-reduce)

    def __post_init__(self):
        if min(self.hidden, self.q_heads, self.kv_heads, self.head_dim, self.intermediate, self.aux_layers) < 1:
            raise ValueError("draft head: every dimension must be >= 1")
        if not 1 <= self.draft_vocab <= VOCAB or self.t0 < 0:
            raise ValueError(f"draft head: draft_vocab must lie in [1, {VOCAB}] and t0 >= 0")

    @property
    def params_fc(self) -> int:
        return self.aux_layers * self.hidden * self.hidden

    @property
    def params_step(self) -> int:
        """Parameters one draft forward reads: the decoder layer ([emb; hidden] into q, k, v; o; MLP) and lm_head."""
        h, qd, kvd = self.hidden, self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * h * (qd + 2 * kvd) + qd * h + 3 * h * self.intermediate + h * self.draft_vocab

    @property
    def params(self) -> int:
        return self.params_fc + self.params_step

    @property
    def weight_bytes(self) -> int:
        return 2 * self.params

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim * 2  # one layer, K and V, bf16

    @property
    def hidden_bytes_per_token(self) -> int:
        return 2 * self.aux_layers * self.hidden  # the target's aux hidden states the trainer keeps for training

    @property
    def train_state_bytes(self) -> int:
        return 16 * self.params  # fp32 master + Adam's two moments + gradient

    def forward_time(self, cost: SpecCost, batch, ctx, tokens=1.0, fc: bool = False) -> np.ndarray:
        """Seconds of one draft forward of ``batch`` sequences, ``tokens`` positions each (``fc``: through the aux
        fusion too), on ``cost``'s roofline."""
        b, ctx, n = (np.asarray(x, dtype=np.float64) for x in (batch, ctx, tokens))
        p = self.params_step + (self.params_fc if fc else 0)
        mem = 2.0 * p + b * ctx * self.kv_bytes_per_token
        flop = b * n * (2.0 * p + 4.0 * self.q_heads * self.head_dim * ctx)
        return self.t0 + np.maximum(mem / (cost.tp * cost.bandwidth), flop / (cost.tp * cost.flops))

    def draft_time(self, cost: SpecCost, batch, k, ctx, tau) -> np.ndarray:
        """Seconds of drafting ``k`` tokens per sequence (``k`` forwards; the first over the ``tau`` tokens the last
        verify kept, through ``fc``); 0 where ``k`` is 0."""
        k = np.asarray(k, dtype=np.float64)
        first = self.forward_time(cost, batch, ctx, tau, fc=True)
        rest = self.forward_time(cost, batch, ctx)
        return np.where(k > 0, first + np.maximum(k - 1, 0) * rest, 0.0)

    def kv_tokens(self, target_kv_tokens: int | None) -> int | None:
        """KV-cache tokens a replica keeps once the head's weights and its KV share the target's memory."""
        if target_kv_tokens is None:
            return None
        return int((target_kv_tokens * KV_BYTES - self.weight_bytes) // (KV_BYTES + self.kv_bytes_per_token))


@dataclass(frozen=True)
class ChainAcceptance:
    """Conditional acceptance ``rates`` a_1..a_n of a chain of greedy drafts, and their source."""

    rates: tuple
    source: str

    def __post_init__(self):
        if not self.rates or not all(0 <= a <= 1 for a in self.rates):
            raise ValueError(f"acceptance rates must be a non-empty tuple in [0, 1], got {self.rates}")

    def at(self, k: int) -> np.ndarray:
        """a_1..a_k, the last ratio of consecutive rates continuing beyond the given positions."""
        r = list(self.rates)
        ratio = r[-1] / r[-2] if len(r) > 1 and r[-2] > 0 else 1.0
        while len(r) < k:
            r.append(min(1.0, r[-1] * ratio))
        return np.asarray(r[:k], dtype=np.float64)

    def reach(self, k: int) -> np.ndarray:
        """P(the first i drafts are all accepted), i = 1..k."""
        return np.cumprod(self.at(k))

    def tau(self, k: int) -> float:
        """Tokens per target step at depth ``k``, bonus included."""
        return 1.0 + float(self.reach(k).sum()) if k > 0 else 1.0

    def blend(self, other: ChainAcceptance, w: float, source: str) -> ChainAcceptance:
        n = max(len(self.rates), len(other.rates), K_MAX)
        return ChainAcceptance(tuple((w * self.at(n) + (1 - w) * other.at(n)).tolist()), source)

    @classmethod
    def flat(cls, tau: float, k: int, source: str) -> ChainAcceptance:
        """Equal rates that give ``tau`` tokens per step at depth ``k``."""
        from .speculation import acceptance_rate

        return cls((acceptance_rate(tau, k),), source)

    @classmethod
    def best_of(cls, a: ChainAcceptance, b: ChainAcceptance, source: str) -> ChainAcceptance:
        """Each step takes whichever of two independent drafts turns out longer: P(max reaches i) = 1 - (1 - P_a(i))
        (1 - P_b(i)). An upper bound on picking per request by the expected match."""
        reach = 1.0 - (1.0 - a.reach(K_MAX)) * (1.0 - b.reach(K_MAX))
        rates = reach / np.concatenate([[1.0], reach[:-1]])
        return cls(tuple(np.clip(rates, 0.0, 1.0).tolist()), source)


REF_K = 3  # depth the published figures are read at
MATH_HEAD = ChainAcceptance.flat(3.465, REF_K, "AQ-MedAI/Qwen3.5-397B-A17B-eagle3 model card: 3.40 (GSM8K) / 3.53 "
                                 "(MATH-500) tokens per step at batch 1, published; k=3 and flat rates assumed")
CHAT_HEAD = ChainAcceptance((0.714, 0.427, 0.257), "Ichigec/a1-agents-eagle3-speculator model card: a head trained "
                            "on ShareGPT alone, per-position accuracy 71.4/42.7/25.7% at k=3 (~2.0 per step), "
                            "published")


@dataclass(frozen=True)
class Drift:
    """How a head forgets the policy: weight ``2 ** (-lag / half_life)`` on its own rates (an assumption)."""

    half_life: float = 50.0  # RL steps; not measured (issue 44 item 5's CPU run measures it)
    floor: ChainAcceptance = CHAT_HEAD

    def __post_init__(self):
        if self.half_life <= 0:
            raise ValueError(f"drift half_life={self.half_life} must be > 0 RL steps")

    def at(self, head: ChainAcceptance, lag: float) -> ChainAcceptance:
        """``head``'s rates ``lag`` policy versions later: toward the floor's, never above the head's own (a head
        weaker than the floor's does not gain by drifting)."""
        w = 2.0 ** (-max(lag, 0.0) / self.half_life)
        floor = ChainAcceptance(tuple(np.minimum(head.at(K_MAX), self.floor.at(K_MAX)).tolist()), self.floor.source)
        return head.blend(floor, w, f"{head.source}; {lag:g} RL steps of drift (half-life {self.half_life:g}, "
                                    "assumed)")


@dataclass(frozen=True)
class Training:
    """The online head's training per RL step (bounded) and where it runs."""

    opt_steps: int = 16
    tokens_per_opt_step: int = 65536
    ttt: int = 3  # training-time-test positions unrolled (speculators' default depth)
    mfu: float = 0.3  # of the GPUs' effective FLOP/s (a one-layer model trains far from peak)
    gpus: int = 16  # after the actor update: every GPU of the colocated pool

    def __post_init__(self):
        if min(self.opt_steps, self.tokens_per_opt_step, self.ttt, self.gpus) < 1 or not 0 < self.mfu <= 1:
            raise ValueError("training: opt_steps, tokens_per_opt_step, ttt, gpus >= 1 and mfu in (0, 1]")

    def gpu_seconds(self, head: DraftHead, cost: SpecCost, tokens: int) -> float:
        trained = min(tokens, self.opt_steps * self.tokens_per_opt_step)
        return 6.0 * head.params * self.ttt * trained / (cost.flops * self.mfu)


WHERE = ("after-actor", "tail")
LAG = {"after-actor": 1, "tail": 2}


def best_depth(cost: SpecCost, head: DraftHead, acc: ChainAcceptance, batch, ctx: float, k_max: int = K_MAX,
               extra_s=0.0) -> np.ndarray:
    """Per live batch size, the depth 0..k_max with the most tokens per second: tau(k) t(B, 0) / (t(B, k) +
    D(B, k)); ``extra_s`` more seconds per drafting step (a CPU proposer beside the head)."""
    b = np.asarray(batch, dtype=np.float64)[:, None]
    ks = np.arange(k_max + 1, dtype=np.float64)[None, :]
    tau = np.array([acc.tau(int(k)) for k in range(k_max + 1)])[None, :]
    t = cost.step_time(b, ks, ctx) + head.draft_time(cost, b, ks, ctx, tau) + np.where(ks > 0, extra_s * b, 0.0)
    return np.argmax(tau / t, axis=1)


def schedule(depths) -> list[list[int]]:
    """A depth per batch size 1..len(depths) as vLLM's ``num_speculative_tokens_per_batch_size`` (inclusive ranges;
    vLLM carries the last entry's K to larger batches and caps K at ``num_speculative_tokens``, their max)."""
    out: list[list[int]] = []
    for b, k in enumerate(np.asarray(depths).tolist(), start=1):
        if out and out[-1][2] == k:
            out[-1][1] = b
        else:
            out.append([b, b, int(k)])
    return out


@dataclass(frozen=True)
class LearnedSpeculation:
    """What the engine model applies for a learned drafter at one RL step: the depth by running count from the
    schedule (``depths[B - 1]``, the last beyond), the chain's tokens per step, the head's forwards charged.
    ``extra_s_per_token``: CPU seconds per emitted token of a proposer beside it (the combination); ``sync_penalty``
    from the cost model where that proposer turns async scheduling off."""

    cost: SpecCost
    head: DraftHead
    acc: ChainAcceptance
    depths: tuple
    extra_s_per_token: float = 0.0
    charge_draft: bool = True  # False only to show what leaving the head's forwards out would claim
    taus: tuple = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "taus", tuple(self.acc.tau(k) for k in range(max(self.depths) + 1)))

    def factor(self, running, ctx_mean) -> np.ndarray:
        r = np.maximum(np.asarray(running, dtype=np.float64), 1.0)
        ctx = np.asarray(ctx_mean, dtype=np.float64)
        d = np.asarray(self.depths)
        k = d[np.minimum(r.astype(np.int64), len(d)) - 1]
        tau = np.asarray(self.taus)[k]
        c = self.cost
        spec = c.step_time(r, k, ctx) + self.extra_s_per_token * r * tau
        if self.charge_draft:
            spec = spec + self.head.draft_time(c, r, k, ctx, tau)
        f = np.where(k > 0, spec / (tau * c.step_time(r, 0, ctx)), 1.0)
        piecewise = len(set(self.depths)) > 1 or c.ragged_drafts  # a schedule or ragged drafts: no FULL graphs
        return f * (1.0 + c.sync_penalty + (c.graph_penalty if piecewise else 0.0))

    def min_factor(self) -> float:
        grid = np.arange(1, len(self.depths) + 1, dtype=np.float64)
        ctx = np.array([0.0, 2e4]) + self.cost.prompt_len
        return float(min(1.0, self.factor(grid[:, None], ctx[None, :]).min()))


__all__ = ["DraftHead", "ChainAcceptance", "Drift", "Training", "LearnedSpeculation", "MATH_HEAD", "CHAT_HEAD",
           "REF_K", "K_MAX", "WHERE", "LAG", "best_depth", "schedule"]
