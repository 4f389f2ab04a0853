"""Multi-turn (tool-calling) rollouts in the simulator (issue 18 item 7): traces, an engine model in which a
trajectory leaves the engine during each tool call, and the driver that replays them through the same policies.

**Trajectory** (one GRPO response of an agent loop, e.g. verl's ``ToolAgentLoop``): assistant turn 0, tool call 0,
assistant turn 1, ..., assistant turn T-1 (a tool call follows every assistant turn but the last). Stored as
interleaved segments ``seg[..., 2k]`` = assistant tokens of turn k, ``seg[..., 2k+1]`` = tokens of tool k's output
(0: no such tool call), and ``lat[..., k]`` = tool k's latency in seconds. The response budget
(``response_length``, or a cap) counts assistant + tool tokens, as verl's ``response_length`` does for the response
mask of a multi-turn trajectory: the segments are clipped in order (``clip_budget``); a turn cut by the budget makes
no tool call, a tool output that overflows is cut and ends the trajectory when the tool returns.

**Shapes** (``MT_SHAPES``, stated assumptions, not calibrated on any run): per prompt a difficulty ``z ~ N(0, 1)``
that random-walks between epochs (``epoch_sigma`` per epoch); per trajectory ``1 + Binomial(max_calls - 1,
sigmoid(calls_logit + calls_coef z))`` tool calls, so harder prompts make more calls; assistant turns lognormal
around ``turn_median x exp(between_sigma z)`` (harder prompts: longer turns) with ``within_sigma`` per turn; tool
outputs lognormal around ``tool_tokens_median``; tool latencies per call, log-uniform on 0.5-10 s (reference) or
lognormal with a long tail (held-out). ``mt-reference``: 1-8 tool calls, 0.5-10 s. ``mt-heldout`` (not tuned on):
1-12 tool calls, easy prompts few and hard ones many (steeper in z), shorter turns, longer tool outputs, tool latency
lognormal (median 3 s, log-sd 1.0, 0.2-60 s).

**Engine** (``simulate_mt_step``; the same ``EngineParams`` as ``recipe.sim.engine``): every trajectory of a step is
submitted at t=0 and routed by verl's least-in-flight rule (``engine.assign_replicas``); its later turns stay on that
replica (verl's sticky sessions). A replica runs at most ``max_num_seqs`` sequences; waiting sequences are admitted
FCFS (a trajectory back from a tool joins the back of the queue) or by priority. An admitted turn first prefills its
whole context (prompt + every earlier segment) at ``prefill_tok_s`` per token, stalling the replica's decoding, then
decodes its assistant tokens one per decode step of ``a + b * running + c * context``. When the turn ends the
sequence **leaves the engine** (its slot is free at once) for the tool's latency; **its KV is assumed dropped**
(``reprefill="full"``, default: a long tool wait under load evicts it, and vLLM's prefix cache is not counted on),
so on return it **prefills its whole context again**. ``reprefill="new"`` is the optimistic alternative (the prefix
survives, only the tool output is prefilled). A tool returning mid-step joins the queue after that step.

**Left out**: the KV-cache capacity, admission and preemption (``kv_tokens`` is ignored here: the trajectories of a
step are assumed to fit), chunked prefill budgets (a prefill stalls the whole replica), tool-side queueing and
failures (latencies are independent draws), tool-call parsing and reward time, a tool output's dependence on what
was said, the turn that a tool call's result changes (lengths are drawn up front), verl's per-turn
``max_assistant_turns`` / ``max_user_turns`` limits (the turn counts stay in range by construction), and the time the
agent-loop worker itself spends between turns.

**Aborts** (over-sample losers, the tail cut) can hit a trajectory mid-turn, waiting in the queue, or mid-tool.
Trained (the tail cut): it keeps what it has (every completed segment plus the partial turn), truncated. ``restart``:
everything is thrown away and the prompt is drawn afresh later. ``continue``: it resumes from its **last turn
boundary**: the partial assistant turn is discarded (regenerated from its start, with the same length: the trace's
draw is kept), completed tool calls are not re-run (their outputs are in the context, re-prefilled on resume), and a
tool call that was in flight at the abort is issued again (its latency is paid again).

Ordering by expected time (issue 18 item 6): ``MTOptions(order_by="time")`` sorts an epoch by
``recipe.core.ordering.expected_time_key``: the row's token estimate plus its tool-call estimate times the mean tool
latency the run has observed, in tokens (times ``tokens_per_s``). Everything else (estimates, caps, the cut,
over-sampling) is the single-turn ``Policy`` from ``recipe.sim.policies`` unchanged, on trajectory totals.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from recipe.core.estimates import LengthEstimates
from recipe.core.ordering import ORDER_KEYS, expected_time_key

from .engine import EngineParams, _steps_within, assign_replicas
from .policies import POLICIES, Policy, PolicySpec
from .run import PolicyRun, StepRecord, summarize, token_limit
from .trace import Trace

REPREFILL = ("full", "new")
LATENCY_KINDS = ("loguniform", "lognormal")


# -- traces ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MTShape:
    num_prompts: int = 512
    n: int = 8
    epochs: int = 4
    response_length: int = 16384
    seed: int = 0
    max_calls: int = 8  # tool calls per trajectory: 1 + Binomial(max_calls - 1, p(z))
    calls_logit: float = -0.3
    calls_coef: float = 0.8  # harder prompts (larger z) make more calls
    turn_median: float = 700.0  # assistant tokens per turn at z = 0
    between_sigma: float = 0.45  # log-sd of a prompt's turn length level (times z)
    within_sigma: float = 0.6  # log-sd of one turn around its prompt's level
    min_turn: int = 16
    tool_tokens_median: float = 250.0
    tool_tokens_sigma: float = 0.8
    latency: str = "loguniform"  # loguniform on [latency_lo, latency_hi] | lognormal(latency_median, latency_sigma)
    latency_lo: float = 0.5
    latency_hi: float = 10.0
    latency_median: float = 3.0
    latency_sigma: float = 1.0
    epoch_sigma: float = 0.3  # sd of the per-epoch random-walk step of z

    def __post_init__(self):
        if self.max_calls < 1 or self.latency not in LATENCY_KINDS or not 0 <= self.latency_lo <= self.latency_hi:
            raise ValueError(f"MTShape: max_calls >= 1, latency one of {LATENCY_KINDS}, 0 <= latency_lo <= hi")


MT_SHAPES: dict[str, dict] = {
    "mt-reference": {},
    "mt-heldout": {"max_calls": 12, "calls_logit": -1.2, "calls_coef": 1.2, "turn_median": 500.0,
                   "tool_tokens_median": 400.0, "latency": "lognormal", "latency_median": 3.0, "latency_sigma": 1.0,
                   "latency_lo": 0.2, "latency_hi": 60.0},
}


def clip_budget(seg: np.ndarray, budget) -> np.ndarray:
    """Segments clipped in order to ``budget`` total tokens (broadcast over the leading axes)."""
    seg = np.asarray(seg, dtype=np.int64)
    b = np.asarray(budget, dtype=np.int64)[..., None] if np.ndim(budget) else int(budget)
    before = np.cumsum(seg, axis=-1) - seg
    return np.minimum(seg, np.maximum(0, b - before))


def segment_count(seg: np.ndarray) -> np.ndarray:
    """Segments a trajectory has (the last non-zero one + 1; clipping zeroes only a suffix)."""
    nz = np.asarray(seg) > 0
    last = nz.shape[-1] - 1 - np.argmax(nz[..., ::-1], axis=-1)
    return np.where(nz.any(axis=-1), last + 1, 0)


def _draw(rng: np.random.Generator, z: np.ndarray, n: int, s: MTShape) -> tuple[np.ndarray, np.ndarray]:
    r, k = len(z), s.max_calls + 1
    p = 1.0 / (1.0 + np.exp(-(s.calls_logit + s.calls_coef * z)))
    calls = 1 + rng.binomial(s.max_calls - 1, np.broadcast_to(p[:, None], (r, n)))
    turn = np.exp(math.log(s.turn_median) + s.between_sigma * z[:, None, None]
                  + s.within_sigma * rng.standard_normal((r, n, k)))
    a = np.maximum(np.rint(turn), s.min_turn).astype(np.int64)
    o = np.maximum(np.rint(np.exp(math.log(s.tool_tokens_median)
                                  + s.tool_tokens_sigma * rng.standard_normal((r, n, k)))), 1).astype(np.int64)
    if s.latency == "loguniform":
        lat = np.exp(rng.uniform(math.log(s.latency_lo), math.log(s.latency_hi), (r, n, k)))
    else:
        lat = np.clip(np.exp(math.log(s.latency_median) + s.latency_sigma * rng.standard_normal((r, n, k))),
                      s.latency_lo, s.latency_hi)
    j = np.arange(k)
    a = np.where(j < (calls + 1)[..., None], a, 0)
    o = np.where(j < calls[..., None], o, 0)
    seg = np.empty((r, n, 2 * k), np.int64)
    seg[..., 0::2], seg[..., 1::2] = a, o
    return clip_budget(seg, s.response_length), np.where(j < calls[..., None], lat, 0.0)


@dataclass
class MTTrace:
    name: str
    shape: MTShape
    z: np.ndarray  # (epochs, prompts) difficulty of each prompt in each epoch
    seg: np.ndarray  # (epochs, prompts, n, 2K) clipped segments
    lat: np.ndarray  # (epochs, prompts, n, K) tool latencies (s)
    stream: int = 0  # 0: this run; 2: an earlier run (previous_run)

    @property
    def epochs(self) -> int:
        return self.seg.shape[0]

    @property
    def num_prompts(self) -> int:
        return self.seg.shape[1]

    @property
    def n(self) -> int:
        return self.seg.shape[2]

    @property
    def response_length(self) -> int:
        return self.shape.response_length

    @property
    def totals(self) -> np.ndarray:
        return self.seg.sum(axis=-1)

    @property
    def calls(self) -> np.ndarray:
        return (self.seg[..., 1::2] > 0).sum(axis=-1)

    def attempt(self, epoch: int, rows: np.ndarray, attempt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Segments and latencies of ``rows`` on their ``attempt``-th launch (0: the trace's; a restarted prompt
        draws fresh trajectories around the same difficulty, independent of which other rows retry)."""
        rows, attempt = np.asarray(rows, np.int64), np.asarray(attempt, np.int64)
        seg, lat = self.seg[epoch, rows].copy(), self.lat[epoch, rows].copy()
        for a in np.unique(attempt[attempt > 0]):
            rng = np.random.default_rng([self.shape.seed, self.stream, epoch, int(a), 1])
            s2, l2 = _draw(rng, self.z[epoch], self.n, self.shape)
            sel = np.flatnonzero(attempt == a)
            seg[sel], lat[sel] = s2[rows[sel]], l2[rows[sel]]
        return seg, lat

    def as_trace(self) -> Trace:
        """The trajectory totals as a single-turn ``Trace`` (warm start, oracle order, reports)."""
        tot = np.maximum(self.totals, 1)
        return Trace(name=self.name, lengths=tot, response_length=self.response_length,
                     censored=np.zeros(tot.shape, bool), row_ids=np.arange(self.num_prompts),
                     params={"shape": self.name, **dataclasses.asdict(self.shape)})

    def previous_run(self) -> MTTrace:
        """An earlier run on the same prompts: the same epoch-0 difficulties, its own walk and draws."""
        return _generate(self.name, self.shape, stream=2, z0=self.z[0])

    def summary(self) -> dict:
        tot, calls = self.totals, self.calls
        return {"mean_tokens": round(float(tot.mean()), 1),
                "truncated_fraction": round(float((tot >= self.response_length).mean()), 4),
                "mean_tool_calls": round(float(calls.mean()), 2),
                "mean_tool_latency_s": round(float(self.lat[self.seg[..., 1::2] > 0].mean()), 2),
                "mean_tool_seconds_per_trajectory": round(float(self.lat.sum(axis=-1).mean()), 1)}


def _generate(name: str, s: MTShape, stream: int = 0, z0: np.ndarray | None = None) -> MTTrace:
    rng = np.random.default_rng([s.seed, stream])
    z = rng.standard_normal(s.num_prompts) if z0 is None else np.asarray(z0, np.float64)
    walk = np.cumsum(s.epoch_sigma * rng.standard_normal((s.epochs, s.num_prompts)), axis=0)
    walk[0] = 0.0
    ze = z[None, :] + walk
    segs, lats = zip(*(_draw(rng, ze[e], s.n, s) for e in range(s.epochs)))
    return MTTrace(name=name, shape=s, z=ze, seg=np.stack(segs), lat=np.stack(lats), stream=stream)


def generate_mt(shape: str = "mt-reference", **overrides) -> MTTrace:
    if shape not in MT_SHAPES:
        raise ValueError(f"unknown multi-turn shape {shape!r}; choose one of {sorted(MT_SHAPES)}")
    return _generate(shape, MTShape(**{**MT_SHAPES[shape], **overrides}))


def from_turns(turns: list[list[tuple[int, float, int]]], response_length: int = 16384) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """Segments and latencies of hand-written trajectories: each a list of turns ``(assistant tokens, tool latency,
    tool tokens)``, the last turn's tool ignored (tests, examples)."""
    k = max(len(t) for t in turns)
    seg = np.zeros((len(turns), 2 * k), np.int64)
    lat = np.zeros((len(turns), k))
    for i, traj in enumerate(turns):
        for j, (a, latency, o) in enumerate(traj):
            seg[i, 2 * j] = a
            if j < len(traj) - 1:
                seg[i, 2 * j + 1], lat[i, j] = o, latency
    return clip_budget(seg, response_length), lat


# -- engine ------------------------------------------------------------------------------------------------------
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
@dataclass(frozen=True)
class MTOptions:
    order_by: str = "tokens"  # tokens | time (recipe.core.ordering.expected_time_key)
    tokens_per_s: float = 60.0  # decode tokens per second of one sequence, to put tool seconds in tokens

    def __post_init__(self):
        if self.order_by not in ORDER_KEYS or not self.tokens_per_s > 0:
            raise ValueError(f"order_by must be one of {ORDER_KEYS} and tokens_per_s > 0")


class TimeKeyEstimates:
    """What ``EpochPlan`` reads (``known``, ``filled``, ``get``, ``num_rows``), with the time key in place of the
    token estimate; the token estimates themselves are unchanged (caps, the cut's level and priorities use them)."""

    def __init__(self, policy: MTPolicy):
        self.policy = policy

    @property
    def num_rows(self) -> int:
        return self.policy.estimates.num_rows

    @property
    def known(self) -> np.ndarray:
        return self.policy.estimates.known

    def get(self, rows, fill_prior: bool = True) -> np.ndarray:
        pol = self.policy
        calls = np.nan_to_num(pol.calls.get(rows, fill_prior), nan=0.0)
        return expected_time_key(pol.estimates.get(rows, fill_prior), calls, pol.mean_latency(),
                                 pol.opts.tokens_per_s)

    def filled(self) -> np.ndarray:
        return self.get(np.arange(self.num_rows))

    def state_dict(self) -> dict:
        return self.policy.estimates.state_dict()


class MTPolicy(Policy):
    """``Policy`` on trajectory totals, plus per-row tool-call estimates and the run's mean tool latency (what the
    time key needs; the trainer would read both from verl's per-trajectory ``num_turns`` and tool timings)."""

    def __init__(self, spec: PolicySpec, opts: MTOptions, *, mt_previous: MTTrace | None = None, **kw):
        super().__init__(spec, previous=None if mt_previous is None else mt_previous.as_trace(), **kw)
        self.opts = opts
        self.calls = LengthEstimates(self.estimates.num_rows, ema_decay=spec.ema_decay, statistic="mean")
        self.latency_sum, self.latency_count = 0.0, 0
        if spec.warm_start != "none" and mt_previous is not None:  # its first epoch, as the token estimates
            calls = mt_previous.calls[0]
            rows = np.repeat(np.arange(calls.shape[0]), calls.shape[1])
            self.calls.warm_start(rows, calls.ravel(), (mt_previous.totals[0] >= mt_previous.response_length).ravel())
            done = mt_previous.seg[0][..., 1::2] > 0
            self.latency_sum, self.latency_count = float(mt_previous.lat[0][done].sum()), int(done.sum())
        if opts.order_by == "time" and spec.order == "plan":
            self.plan.estimates = TimeKeyEstimates(self)

    def mean_latency(self) -> float:
        return self.latency_sum / self.latency_count if self.latency_count else 0.0

    def observe_mt(self, plan, lengths, kept, stopped, calls, latency_sum, latency_count):
        resp = self.observe(plan, lengths, kept, stopped)
        n = lengths.shape[1]
        self.calls.update(np.repeat(plan.rows[kept], n), calls[kept].ravel(), resp.censored())
        self.latency_sum += float(latency_sum)
        self.latency_count += int(latency_count)
        return resp


MT_POLICIES: dict[str, tuple[PolicySpec, MTOptions]] = {}


def register_mt(name: str, spec: PolicySpec, opts: MTOptions | None = None) -> str:
    MT_POLICIES[name] = (dataclasses.replace(spec, name=name), opts or MTOptions())
    return name


# The multi-turn policy set. The over-sample ratios and the time key's tokens_per_s are bench/sim_multiturn.py's
# choice on mt-reference trace seeds 10-11 (the fastest of its grid); everything else is the single-turn policy's.
MT_RESTART_RATIO = 0.5
MT_CONTINUE_RATIO = 1.0
MT_TOKENS_PER_S = 120.0
for _name, _base in (("baseline", "baseline"), ("seed", "seed"), ("tailcut-level", "tailcut-level"),
                     ("order-tokens", "onpolicy-order")):
    register_mt(_name, POLICIES[_base])
register_mt("oversample-restart",
            dataclasses.replace(POLICIES["oversample-restart"], oversample_ratio=MT_RESTART_RATIO))
register_mt("oversample-continue", dataclasses.replace(POLICIES["best"], oversample_ratio=MT_CONTINUE_RATIO))
register_mt("order-time", POLICIES["onpolicy-order"], MTOptions("time", MT_TOKENS_PER_S))
register_mt("tailcut-level-time", POLICIES["tailcut-level"], MTOptions("time", MT_TOKENS_PER_S))
MT_DEFAULT_POLICIES = ("baseline", "seed", "tailcut-level", "oversample-restart", "oversample-continue",
                       "order-tokens", "order-time", "tailcut-level-time")


# -- driver ------------------------------------------------------------------------------------------------------
def _prefix(seg: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Tokens of the first ``pos`` segments of each trajectory."""
    cum = np.concatenate([np.zeros(seg.shape[:-1] + (1,), np.int64), np.cumsum(seg, axis=-1)], axis=-1)
    return np.take_along_axis(cum, pos[..., None], axis=-1)[..., 0]


@dataclass
class MTStepDetail:
    """What the tests read of a step besides the ``StepRecord``."""

    rows: np.ndarray
    seg: np.ndarray  # (rows, n, 2K) launched (clipped) segments
    pos0: np.ndarray
    pos: np.ndarray  # segments completed at the step's end
    partial: np.ndarray
    decoded: np.ndarray  # assistant tokens decoded in this step
    kept: np.ndarray
    stopped: np.ndarray
    resumed_from: np.ndarray  # continue: the boundary each aborted trajectory resumes from (-1: none)
    tool_runs: np.ndarray  # tool calls started in this step per trajectory


def run_mt_policy(trace: MTTrace, name: str, engine: EngineParams, *, batch_size: int, seed: int = 0,
                  previous: MTTrace | None = None, reprefill: str = "full", details: list | None = None) -> PolicyRun:
    """Replay every epoch of ``trace`` under multi-turn policy ``name`` (``MT_POLICIES``); ``details`` collects an
    ``MTStepDetail`` per step. ``StepRecord.recomputed_tokens`` holds the re-prefilled tokens of trajectories back
    from a tool, ``wasted_tokens`` every decoded token thrown away (restarted groups, and the partial turns
    ``continue`` regenerates)."""
    spec, opts = MT_POLICIES[name]
    if spec.warm_start != "none" and previous is None:
        previous = trace.previous_run()
    num = trace.num_prompts // batch_size * batch_size
    policy = MTPolicy(spec, opts, mt_previous=previous, num_rows=num, batch_size=batch_size,
                      response_length=trace.response_length, seed=seed, truth=trace.totals[:, :num])
    out = PolicyRun(name=name, spec=spec.to_dict(), warm_rows=policy.warm_rows)
    n, L, step = trace.n, trace.response_length, 0
    for epoch in range(trace.epochs):
        policy.start_epoch(epoch)
        draw = np.zeros(num, np.int64)
        partial: dict[int, tuple] = {}  # row -> (raw seg, lat, resume pos, first step) per sample
        while not policy.epoch_finished():
            plan = policy.plan_step()
            rows = plan.rows
            raw, lat = trace.attempt(epoch, rows, draw[rows])
            pos0 = np.zeros((len(rows), n), np.int64)
            first = np.full((len(rows), n), -1, np.int64)
            for i, r in enumerate(rows.tolist()):
                if r in partial:
                    raw[i], lat[i], pos0[i], first[i] = partial.pop(r)
            seg = clip_budget(raw, token_limit(plan.caps, L)[:, None])
            nseg = segment_count(seg)
            pos0 = np.minimum(pos0, nseg)
            have = _prefix(seg, pos0)
            prio = None if plan.priority is None else np.repeat(plan.priority, n)
            args = (seg.reshape(-1, seg.shape[-1]), lat.reshape(-1, lat.shape[-1]), pos0.ravel(), engine,
                    [seed, epoch, step])
            full = simulate_mt_step(*args, priority=prio, reprefill=reprefill)
            finish = full.finish.reshape(len(rows), n)
            kept, t_end = np.ones(len(rows), bool), full.time_s
            if plan.keep is not None:
                kept = policy.oversample.select(finish.max(axis=1))
                t_end = float(finish.max(axis=1)[kept].max())
            if policy.tail_cut:
                t_end = min(t_end, policy.tail_cut.cut_time(finish[kept], plan.cut_level))
            res = full
            if t_end < full.time_s:
                res = simulate_mt_step(*args, priority=prio, reprefill=reprefill, stop=t_end)
            pos, part = res.pos.reshape(len(rows), n).copy(), res.partial.reshape(len(rows), n).copy()
            done = finish <= t_end  # the same schedule: what finished by the stop in the full run is done
            pos[done], part[done] = nseg[done], 0
            decoded = np.where(done, full.decoded.reshape(len(rows), n), res.decoded.reshape(len(rows), n))
            produced = _prefix(seg, pos) + part
            stopped = pos < nseg
            if (kept[:, None] & stopped).any() and not policy.tail_cut:
                raise RuntimeError(f"{name} step {step}: a kept group is incomplete")
            calls_done = (seg[..., 1::2] > 0) & (np.arange(seg.shape[-1] // 2) < (pos // 2)[..., None])
            ran = (np.arange(seg.shape[-1] // 2) >= (pos0 // 2)[..., None]) & calls_done
            odd = 2 * np.arange(seg.shape[-1] // 2) + 1  # tool k sits at segment 2k + 1
            issued = (seg[..., 1::2] > 0) & (pos0[..., None] <= odd) & (odd <= pos[..., None])
            plan_first = np.where((first < 0) & (produced > have), step, first)
            policy.observe_mt(plan, produced, kept, stopped, calls_done.sum(axis=-1),
                              lat[kept][ran[kept]].sum(), int(ran[kept].sum()))
            wasted = 0
            resumed_from = np.full((len(rows), n), -1, np.int64)
            for i in np.flatnonzero(~kept):
                r = int(rows[i])
                if plan.keep_partial[i]:  # continue: back to the last turn boundary
                    partial[r] = (raw[i], lat[i], pos[i], np.where(pos[i] > 0, plan_first[i], -1))
                    resumed_from[i] = pos[i]
                    wasted += int(part[i].sum())
                else:
                    draw[r] += 1
                    wasted += int(produced[i].sum())
            versions = np.where(plan_first[kept] >= 0, step - plan_first[kept] + 1, 1)
            resp_trunc = int((stopped[kept] | (produced[kept] >= token_limit(plan.caps, L)[kept, None])).sum())
            capped = int(((plan.caps[kept, None] > 0) & (produced[kept] >= plan.caps[kept, None])).sum())
            out.steps.append(StepRecord(
                epoch=epoch, time_s=t_end, lower_bound_s=0.0, tokens=int(decoded.sum()), wasted_tokens=wasted,
                trained_rows=rows[kept], responses=int(kept.sum()) * n, truncated=resp_trunc, capped=capped,
                caps=plan.caps, spans=versions.max(axis=1), versions=versions.ravel(),
                trained_tokens=int(produced[kept].sum()), stale_tokens=int(have[kept].sum()),
                resumed_responses=int((have[kept] > 0).sum()),
                restarted_groups=int((~kept & ~plan.keep_partial).sum()), max_decoded=int(decoded.max(initial=0)),
                requests=int((pos0 < nseg).sum()), recomputed_tokens=res.reprefill_tokens))
            if details is not None:
                details.append(MTStepDetail(rows=rows, seg=seg, pos0=pos0, pos=pos, partial=part, decoded=decoded,
                                            kept=kept, stopped=stopped, resumed_from=resumed_from,
                                            tool_runs=issued.sum(axis=-1)))
            step += 1
    return out


def simulate_mt(trace: MTTrace, policies, engine: EngineParams, *, batch_size: int = 32, seed: int = 0,
                reprefill: str = "full") -> list[dict]:
    """``summarize`` entries (``recipe.sim.run``) of ``policies`` against ``baseline`` on one multi-turn trace;
    ``reprefill_per_decoded`` adds the re-prefilled tokens per decoded token."""
    names = list(dict.fromkeys(["baseline", *policies]))
    prev = trace.previous_run()
    runs = {nm: run_mt_policy(trace, nm, engine, batch_size=batch_size, seed=seed, previous=prev,
                              reprefill=reprefill) for nm in names}
    num = trace.num_prompts // batch_size * batch_size
    out = []
    for nm in names:
        s = summarize(runs[nm], trace.epochs, num, runs["baseline"])
        ws = [st for st in runs[nm].steps if st.epoch >= 1]
        s["reprefill_per_decoded"] = round(sum(st.recomputed_tokens for st in ws) / max(1, sum(st.tokens for st in ws)),
                                           4)
        out.append(s)
    return out


__all__ = ["MTShape", "MT_SHAPES", "MTTrace", "generate_mt", "clip_budget", "segment_count", "from_turns",
           "simulate_replica", "simulate_mt_step", "MTOptions", "MTPolicy", "MT_POLICIES", "register_mt",
           "run_mt_policy", "simulate_mt", "MT_DEFAULT_POLICIES"]


def main(argv: list[str] | None = None) -> int:
    """``python -m recipe.sim.multiturn``: one multi-turn shape and seed, every policy, a markdown table."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m recipe.sim.multiturn", description=main.__doc__)
    ap.add_argument("--shape", default="mt-reference", choices=sorted(MT_SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(MT_DEFAULT_POLICIES), help=f"of: {', '.join(MT_POLICIES)}")
    ap.add_argument("--reprefill", choices=REPREFILL, default="full")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--trace-param", action="append", default=[], metavar="KEY=VALUE", help="an MTShape override")
    args = ap.parse_args(argv)
    names = [s for s in args.policies.split(",") if s]
    unknown = [nm for nm in names if nm not in MT_POLICIES]
    if unknown:
        raise SystemExit(f"unknown multi-turn policies {unknown}; known: {', '.join(MT_POLICIES)}")
    fields = {f.name: f.type for f in dataclasses.fields(MTShape)}
    over = {}
    for item in args.trace_param:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--trace-param {item!r}: {key!r} is not an MTShape field")
        over[key] = value if key == "latency" else (int(value) if fields[key] == "int" else float(value))
    trace = generate_mt(args.shape, seed=args.seed, **over)
    print(f"`{args.shape}` seed {args.seed}: {trace.summary()}")
    print("| policy | speedup vs baseline | truncated | stale tokens | wasted tokens | re-prefill per decoded token |")
    print("|---|---|---|---|---|---|")
    for e in simulate_mt(trace, names, EngineParams(kv_tokens=None), batch_size=args.batch_size, seed=args.seed,
                         reprefill=args.reprefill):
        print(f"| {e['name']} | {e['speedup_vs_baseline']:.3f} | {100 * e['truncated_fraction']:.2f}% | "
              f"{100 * e['stale_token_fraction']:.1f}% | {100 * e['wasted_tokens_fraction']:.1f}% | "
              f"{e['reprefill_per_decoded']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
