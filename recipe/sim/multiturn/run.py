"""The multi-turn driver: the single-turn policies on trajectory totals, over-sample aborts at turn boundaries, the
expected-time ordering (the package docstring).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from recipe.core.ordering import ORDER_KEYS
from recipe.core.time_key import TimeKeyEstimates

from ..engine import EngineParams
from ..policies import POLICIES, Policy, PolicySpec
from ..run import PolicyRun, StepRecord, summarize, token_limit
from .engine import simulate_mt_step
from .trace import MTTrace, clip_budget, segment_count

@dataclass(frozen=True)
class MTOptions:
    order_by: str = "tokens"  # tokens | time (recipe.core.ordering.expected_time_key)
    tokens_per_s: float = 60.0  # decode tokens per second of one sequence, to put tool seconds in tokens

    def __post_init__(self):
        if self.order_by not in ORDER_KEYS or not self.tokens_per_s > 0:
            raise ValueError(f"order_by must be one of {ORDER_KEYS} and tokens_per_s > 0")


class MTPolicy(Policy):
    """``Policy`` on trajectory totals, plus the per-row tool-call estimates and the run's mean tool latency that the
    time key needs (``recipe.core.time_key.TimeKeyEstimates``, as the trainer's sampler holds them with
    ``order_by=time``); tracked under either order, the plan sorts by them only with ``order_by=time``."""

    def __init__(self, spec: PolicySpec, opts: MTOptions, *, mt_previous: MTTrace | None = None, **kw):
        super().__init__(spec, previous=None if mt_previous is None else mt_previous.as_trace(), **kw)
        self.opts = opts
        self.time_key = TimeKeyEstimates(self.estimates, opts.tokens_per_s)
        if spec.warm_start != "none" and mt_previous is not None:  # its first epoch, as the token estimates
            calls = mt_previous.calls[0]
            tool_s = np.where(mt_previous.seg[0][..., 1::2] > 0, mt_previous.lat[0], 0.0).sum(axis=-1)
            self.time_key.warm_start(np.repeat(np.arange(calls.shape[0]), calls.shape[1]), calls.ravel(),
                                     tool_s.ravel(), (mt_previous.totals[0] >= mt_previous.response_length).ravel())
        if opts.order_by == "time" and spec.order == "plan":
            self.plan.estimates = self.time_key

    def observe_mt(self, plan, lengths, kept, stopped, calls, latency_sum, latency_count):
        resp = self.observe(plan, lengths, kept, stopped)
        n = lengths.shape[1]
        self.time_key.update_calls(np.repeat(plan.rows[kept], n), calls[kept].ravel(), resp.censored())
        self.time_key.add_latency(float(latency_sum), int(latency_count))
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
