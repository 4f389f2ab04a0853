"""The simulation driver: replay a trace through a policy and the engine model, and summarise the result.

Per step: the policy plans rows (+ cap, + how many groups to keep); each launched response generates
``min(desired, cap, response_length)`` tokens on the engine model; with over-sampling the step ends when the
``keep``-th group completes and the other requests are aborted with the tokens they had; the kept groups go back
to the policy as the trainer would feed them. A cold epoch 0 has no estimates, so ratios are computed over later
epochs; ``epoch0_speedup_vs_baseline`` reports epoch 0 on its own (what a warm start buys).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recipe.traces import LengthTraceWriter, finish_reasons

from .engine import EngineParams, epoch_lower_bound, simulate_step, step_lower_bound
from .policies import POLICIES, Policy, make_policy
from .speculation import SpecCost, Speculation
from .trace import Trace


@dataclass
class StepRecord:
    epoch: int
    time_s: float
    lower_bound_s: float
    tokens: int  # decoded, including aborted work
    wasted_tokens: int  # decoded for groups that were aborted and will be generated again (thrown away)
    trained_rows: np.ndarray
    responses: int  # trained responses
    truncated: int  # trained responses cut by the cap or response_length
    capped: int  # ... of which by the cap
    caps: np.ndarray  # per launched row, 0 = none
    spans: np.ndarray  # per trained group: policy versions from its first token to this step (>1: partial rollout)
    versions: np.ndarray  # per trained response: the same, response by response (1: generated in this step)
    trained_tokens: int = 0  # tokens of the trained responses
    stale_tokens: int = 0  # ... generated in an earlier step, i.e. by an older policy version (partial rollout)
    resumed_responses: int = 0  # trained responses with tokens from an earlier step
    restarted_groups: int = 0  # aborted groups thrown away (restart mode, or continue past max_resumes)
    max_decoded: int = 0  # most tokens one request decoded in this step (with ``tokens``: what fit_engine needs)
    requests: int = 0  # requests sent to the engine (responses with tokens left to generate)
    preemptions: int = 0  # times the engine preempted one of them (KV cache full; vLLM's num_preemptions)
    recomputed_tokens: int = 0  # prefill tokens spent again re-admitting preempted requests


@dataclass
class PolicyRun:
    name: str
    spec: dict
    steps: list[StepRecord] = field(default_factory=list)
    quality: list[dict] = field(default_factory=list)  # per epoch: how well the order's estimates predicted it
    warm_rows: int = 0  # rows seeded from an earlier run before epoch 0


@dataclass
class StepLaunch:
    """What one planned step asks of the engine: per launched response, the tokens it already has (a resumed
    partial response), the length it will end at, and the step in which its first token was generated."""

    have: np.ndarray  # (rows, n) tokens from earlier steps
    target: np.ndarray  # (rows, n) final length this launch runs to (>= have)
    first_step: np.ndarray  # (rows, n) global step of the first token, -1 while none

    @property
    def todo(self) -> np.ndarray:
        return self.target - self.have


def token_limit(caps: np.ndarray, response_length: int) -> np.ndarray:
    """The tokens each launched row may generate: its cap (vLLM ``max_tokens``; 0: none), at most
    ``response_length``."""
    return np.where(caps > 0, np.minimum(caps, response_length), response_length)


class EpochState:
    """The driver's per-epoch bookkeeping of over-sampled rows (the trainer keeps the same in TransferQueue):
    which fresh draw a row is on (a restarted group draws new responses) and the partial responses of groups the
    controller resumes."""

    def __init__(self, trace: Trace, epoch: int):
        self.trace, self.epoch = trace, epoch
        self.draw = np.zeros(trace.num_prompts, np.int64)
        self.partial: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row -> (tokens, first_step) per response

    def launch(self, plan, response_length: int) -> StepLaunch:
        rows, n = plan.rows, self.trace.n
        limit = token_limit(plan.caps, response_length)
        desired = self.trace.attempt_lengths(self.epoch, rows, self.draw[rows])
        parts = [self.partial.pop(int(r), None) for r in rows]
        for r, part, resumes in zip(rows, parts, plan.resumes):
            if (part is not None) != (resumes > 0):
                raise RuntimeError(f"row {r}: partial responses {'kept' if part is not None else 'missing'} but the "
                                   f"policy planned resumes={resumes}")
        have = np.stack([np.zeros(n, np.int64) if p is None else p[0] for p in parts])
        first = np.stack([np.full(n, -1, np.int64) if p is None else p[1] for p in parts])
        # a resumed response runs on to this launch's limit (the agent loop asks for limit - len(partial))
        return StepLaunch(have=have, target=np.maximum(np.minimum(desired, limit[:, None]), have), first_step=first)

    def settle(self, plan, kept: np.ndarray, produced: np.ndarray, first: np.ndarray) -> int:
        """After ``Policy.observe``: keep the partial responses of resumed rows, give restarted rows a fresh draw;
        returns the tokens thrown away (everything the restarted groups had generated)."""
        wasted = 0
        for i in np.flatnonzero(~kept):
            r = int(plan.rows[i])
            if plan.keep_partial[i]:
                self.partial[r] = (produced[i].copy(), first[i].copy())
            else:
                self.draw[r] += 1
                wasted += int(produced[i].sum())
        return wasted


@dataclass
class StepResult:
    """What an executor reports for one launched step."""

    now: np.ndarray  # (rows, n) tokens each launched response generated in this step (<= launch.todo)
    kept: np.ndarray  # (rows,) groups trained this step (complete; the first ``plan.keep`` to complete)
    time_s: float  # rollout time of the step: until the ``keep``-th group completed (all groups if keep is None)
    lower_bound_s: float = 0.0  # the model's bound for decoding ``now`` (0 where unknown: a real engine)
    preemptions: int = 0  # times the engine preempted a request (KV cache full)
    recomputed_tokens: int = 0  # prefill tokens spent again re-admitting them (0 where unknown: a real engine)


class ModelExecutor:
    """Runs a step on the engine model (``engine.simulate_step``). The replay in ``bench/rollout_replay.py``
    swaps in a real vLLM engine behind the same ``run_step``; everything else (policy, controller, plan,
    bookkeeping) is shared."""

    def __init__(self, engine: EngineParams, seed: int = 0, spec_cost: SpecCost | None = None):
        self.engine, self.seed = engine, seed
        self.spec_cost = spec_cost or SpecCost()  # what drafting costs and buys, for policies that speculate

    def speculation(self, policy: Policy) -> Speculation | None:
        """The drafting schedule of ``policy`` on this executor's cost model (None: it does not speculate)."""
        s = policy.spec
        if s.speculate == "off":
            return None
        return Speculation(self.spec_cost, s.speculate_max_batch if s.speculate == "tail" else None)

    def run_step(self, policy: Policy, plan, launch: StepLaunch, *, epoch: int, global_step: int) -> StepResult:
        todo = launch.todo
        live = todo > 0
        n = todo.shape[1]
        priority = None if plan.priority is None else np.repeat(plan.priority, n).reshape(todo.shape)[live]
        outstanding = np.maximum(plan.expected[:, None] - launch.have, 1.0)[live]  # predicted tokens still to go
        spec = self.speculation(policy)
        placement, groups = policy.spec.placement, None
        if spec is not None and self.spec_cost.group_affinity:  # the group drafter's router (recipe.sim.routing)
            placement = "group"
        if placement == "group":  # by dataset row: a prompt's home is the same every epoch
            groups = np.repeat(plan.rows, n).reshape(todo.shape)[live]
        timing = simulate_step(todo[live], self.engine, np.random.default_rng([self.seed, epoch, global_step]),
                               context0=self.engine.prompt_len + launch.have[live], priority=priority,
                               predicted=outstanding, placement=placement, speculation=spec, groups=groups)
        self.last_timing = timing  # per replica busy time: where a subclass finds the GPUs idle in the tail
        finish = np.zeros(todo.shape)
        finish[live] = timing.finish_time
        kept, t_end = np.ones(len(plan.rows), bool), timing.time_s
        if plan.keep is not None:
            kept = policy.oversample.select(finish.max(axis=1))
            t_end = float(finish.max(axis=1)[kept].max())
        if policy.tail_cut:
            t_end = min(t_end, self.cut_time(policy, plan, launch, finish, kept))
        now = todo.copy()
        if t_end < timing.time_s:
            now[live] = np.minimum(timing.tokens_by(t_end), todo[live])
        bound = step_lower_bound(now[live], self.engine) * (1.0 if spec is None else spec.min_factor())
        return StepResult(now=now, kept=kept, time_s=t_end, lower_bound_s=bound,
                          preemptions=int(timing.num_preempted.sum()),
                          recomputed_tokens=timing.recomputed_tokens)

    def cut_time(self, policy: Policy, plan, launch: StepLaunch, finish: np.ndarray, kept: np.ndarray) -> float:
        """When a tail-cut policy's step ends, given each launched response's finish time (``finish[row, sample]``)
        and the kept groups: the policy's own rule. ``recipe.sim.foresight`` overrides it with a cut that knows the
        future."""
        return policy.tail_cut.cut_time(finish[kept], plan.cut_level)


def iter_policy(trace: Trace, name: str, executor, *, batch_size: int, seed: int = 0,
                record_path: str | Path | None = None, run: PolicyRun | None = None,
                previous: Trace | None = None) -> Iterator[StepRecord]:
    """Replay every epoch of ``trace`` under policy ``name`` on ``executor``, one ``StepRecord`` per step (appended
    to ``run.steps`` when given); optionally write the trainer's JSONL trace. A generator, so a benchmark can
    interleave several policies step by step on one engine. ``previous``: the earlier run warm-started policies
    seed their estimates from.

    Over-sampling: a group the controller restarts (``restart`` mode, or ``continue`` past ``max_resumes``) draws
    fresh responses when launched again (``Trace.attempt_lengths``) and its aborted tokens are wasted; a group it
    resumes (``continue``) keeps its partial responses, which go on where they stopped in the next launch
    (prompt + partial response, the rest of the length), and a finished response of such a group is kept as it is.
    """
    policy: Policy = make_policy(name, num_rows=trace.num_prompts, batch_size=batch_size,
                                 response_length=trace.response_length, seed=seed, truth=trace.lengths,
                                 level=trace.level, previous=previous, row_ids=trace.row_ids)
    if run is not None:
        run.warm_rows = policy.warm_rows
    writer = LengthTraceWriter(record_path) if record_path else None
    global_step = 0
    try:
        for epoch in range(trace.epochs):
            policy.start_epoch(epoch)
            if run is not None:
                run.quality.append(prediction_quality(policy.plan.estimates, trace.lengths[epoch].max(axis=1)))
            state = EpochState(trace, epoch)
            while not policy.epoch_finished():
                plan = policy.plan_step()
                launch = state.launch(plan, trace.response_length)
                res = executor.run_step(policy, plan, launch, epoch=epoch, global_step=global_step)
                kept, now = res.kept, res.now
                complete = policy.tail_cut is not None or bool((now[kept] == launch.todo[kept]).all())
                if now.shape != launch.todo.shape or (now > launch.todo).any() or not complete:
                    raise RuntimeError(f"{name} step {global_step}: the executor's tokens do not fit the launch")
                produced = launch.have + now
                first = np.where((launch.first_step < 0) & (now > 0), global_step, launch.first_step)
                stopped = produced < launch.target
                resp = policy.observe(plan, produced, kept, stopped)
                wasted = state.settle(plan, kept, produced, first)
                versions = np.where(first[kept] >= 0, global_step - first[kept] + 1, 1)
                trunc = resp.censored()
                record = StepRecord(
                    epoch=epoch, time_s=res.time_s, lower_bound_s=res.lower_bound_s,
                    tokens=int(now.sum()), wasted_tokens=wasted, trained_rows=plan.rows[kept],
                    responses=int(resp.lengths.size), truncated=int(trunc.sum()), capped=int(resp.cap_hit().sum()),
                    caps=plan.caps, spans=versions.max(axis=1), versions=versions.ravel(),
                    trained_tokens=int(produced[kept].sum()), stale_tokens=int(launch.have[kept].sum()),
                    resumed_responses=int((launch.have[kept] > 0).sum()),
                    restarted_groups=int((~kept & ~plan.keep_partial).sum()), max_decoded=int(now.max(initial=0)),
                    requests=int((launch.todo > 0).sum()), preemptions=res.preemptions,
                    recomputed_tokens=res.recomputed_tokens)
                global_step += 1
                if writer:
                    _record(writer, trace, epoch, global_step, plan, produced, stopped, res.time_s)
                if run is not None:
                    run.steps.append(record)
                yield record
    finally:
        if writer:
            writer.close()


def run_policy(trace: Trace, name: str, engine: EngineParams, *, batch_size: int, seed: int = 0,
               record_path: str | Path | None = None, previous: Trace | None = None,
               executor: ModelExecutor | None = None, spec_cost: SpecCost | None = None) -> PolicyRun:
    """Replay every epoch of ``trace`` under policy ``name`` on the engine model (see ``iter_policy``);
    ``executor``: a ``ModelExecutor`` subclass instance to run the steps instead (``recipe.sim.foresight``)."""
    out = PolicyRun(name=name, spec=POLICIES[name].to_dict() if name in POLICIES else {})
    executor = executor or ModelExecutor(engine, seed, spec_cost)
    for _ in iter_policy(trace, name, executor, batch_size=batch_size, seed=seed,
                         record_path=record_path, run=out, previous=previous):
        pass
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (what Spearman's correlation needs: many group maxima sit at the limit)."""
    order = np.argsort(x, kind="stable")
    sx = x[order]
    first = np.concatenate([[True], sx[1:] != sx[:-1]])
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.concatenate([starts[1:], [len(x)]])
    out = np.empty(len(x))
    out[order] = ((starts + ends - 1) / 2.0)[group]
    return out


def _top_share(x: np.ndarray, k: int) -> np.ndarray:
    """Each row's membership of the top ``k`` of ``x``: 1 above the k-th largest value, the tied rows at that
    value sharing what is left (random tie-breaking in expectation)."""
    kth = np.sort(x)[::-1][k - 1]
    above, tied = x > kth, x == kth
    return np.where(above, 1.0, np.where(tied, (k - above.sum()) / tied.sum(), 0.0))


def prediction_quality(estimates, group_max: np.ndarray) -> dict:
    """How well the estimates an epoch is ordered by predict that epoch's true group maxima (the oracle's key):
    Spearman's rank correlation, and ``top_decile_hit``: of the groups predicted in the top decile, the share whose
    true maximum is in the epoch's top decile, ties included (about a fifth of the groups reach the response length,
    all tied at the top: a perfect prediction scores 1, a random one about that fifth). NaN when nothing is known (a
    cold epoch 0)."""
    if not estimates.known.any():
        return {"rank_corr": float("nan"), "top_decile_hit": float("nan")}
    pred = np.asarray(estimates.filled(), dtype=np.float64)
    truth = np.asarray(group_max, dtype=np.float64)
    k = max(1, len(pred) // 10)
    hit = float((_top_share(pred, k) * (truth >= np.sort(truth)[::-1][k - 1])).sum() / k)
    corr = np.corrcoef(_ranks(pred), _ranks(truth))[0, 1]
    return {"rank_corr": round(float(corr), 4), "top_decile_hit": round(hit, 4)}


def _record(writer: LengthTraceWriter, trace: Trace, epoch: int, step: int, plan, produced: np.ndarray,
            aborted: np.ndarray, gen_time_s: float) -> None:
    """One trainer-format record; finish reasons from ``recipe.traces.finish_reasons`` with each row's own cap."""
    n = trace.n
    finish = [f for i in range(len(plan.rows))
              for f in finish_reasons(produced[i].tolist(), int(plan.caps[i]) or None, trace.response_length,
                                      aborted[i].tolist())]
    writer.append(epoch=epoch, step=step, cap=int(plan.caps.max()) or None, response_length=trace.response_length,
                  gen_time_s=gen_time_s, rows=np.repeat(trace.row_ids[plan.rows], n).tolist(),
                  sample_index=np.tile(np.arange(n), len(plan.rows)).tolist(), lengths=produced.ravel().tolist(),
                  predicted=np.repeat(plan.predicted, n).tolist(), finish=finish)


def warm_epochs(epochs: int) -> list[int]:
    """Epochs that count for ratios: all but the first (which has no estimates), unless there is only one."""
    return list(range(1, epochs)) if epochs > 1 else [0]


def summarize(run: PolicyRun, epochs: int, num_rows: int, baseline: PolicyRun | None = None,
              oracle: PolicyRun | None = None) -> dict:
    """The report entry of one policy. Everything but the per-epoch lists covers the warm epochs only.

    ``tokens_per_s`` counts every decoded token (aborted work included; ``wasted_tokens_fraction`` says how much
    was thrown away by restarts); ``truncated_fraction`` is the share of trained responses that did not end with EOS
    (limit, cap or tail cut); ``lower_bound_s`` sums, over this policy's steps, the bound for decoding what each step
    decoded. ``trained_mean_length``: mean length of the trained responses (below baseline's when a policy
    selects: caps cut long responses, restarts replace the draws that lost the race twice by fresh ones).

    Staleness (partial rollout only; 0 / 1 for on-policy policies): ``stale_token_fraction``: share of trained
    tokens generated in an earlier step, i.e. by an older policy than the one trained; ``resumed_response_fraction``:
    trained responses holding such tokens (``resumed_group_fraction``: trained groups); ``max_policy_versions``:
    the most policy versions a trained response spans, from the one that generated its first token to the one
    trained on it (``max_resumes + 1`` at most); ``mean_policy_versions_resumed``: their mean over the resumed
    responses; ``restarted_groups``: aborted groups thrown away and generated again from scratch.

    KV cache: ``preemptions_per_request``: vLLM preemptions (KV cache full) per request sent;
    ``recomputed_tokens_fraction``: prefill tokens recomputed for the preempted, over decoded tokens. Estimates:
    ``prediction_rank_corr_per_epoch`` and ``top_decile_hit_per_epoch`` (``prediction_quality``; None where the
    epoch had no estimates); ``epoch0_speedup_vs_baseline``: epoch 0 alone (cold unless the policy warm-starts,
    ``warm_started_rows``).
    """
    warm = set(warm_epochs(epochs))
    ws = [s for s in run.steps if s.epoch in warm]
    times = np.array([s.time_s for s in ws])
    epoch_times = [sum(s.time_s for s in run.steps if s.epoch == e) for e in range(epochs)]
    trained = [np.concatenate([s.trained_rows for s in run.steps if s.epoch == e] or [np.zeros(0, np.int64)])
               for e in range(epochs)]
    resp = sum(s.responses for s in ws)
    total = float(times.sum())
    spans = np.concatenate([s.spans for s in ws])
    versions = np.concatenate([s.versions for s in ws])
    trained_tokens = sum(s.trained_tokens for s in ws)

    def ratio(other: PolicyRun | None) -> float | None:
        if other is None:
            return None
        return round(sum(s.time_s for s in other.steps if s.epoch in warm) / total, 4)

    def quality(key: str) -> list:
        return [None if math.isnan(q[key]) else q[key] for q in run.quality]

    epoch0 = None
    if baseline is not None and epoch_times[0] > 0:
        epoch0 = round(sum(s.time_s for s in baseline.steps if s.epoch == 0) / epoch_times[0], 4)

    return {
        "name": run.name,
        "spec": run.spec,
        "epoch_times_s": [round(t, 1) for t in epoch_times],
        "rollout_time_s": round(total, 1),
        "speedup_vs_baseline": ratio(baseline),
        "time_vs_oracle": None if oracle is None else round(1.0 / ratio(oracle), 4),
        "lower_bound_s": round(sum(s.lower_bound_s for s in ws), 1),
        "time_vs_lower_bound": (round(total / sum(s.lower_bound_s for s in ws), 4)
                                if sum(s.lower_bound_s for s in ws) > 0 else None),
        "step_time_p50_s": round(float(np.percentile(times, 50)), 1),
        "step_time_p95_s": round(float(np.percentile(times, 95)), 1),
        "step_time_max_s": round(float(times.max()), 1),
        "steps_per_epoch": [sum(1 for s in run.steps if s.epoch == e) for e in range(epochs)],
        "tokens_per_s": round(sum(s.tokens for s in ws) / total, 1),
        "wasted_tokens_fraction": round(sum(s.wasted_tokens for s in ws) / max(1, sum(s.tokens for s in ws)), 4),
        "truncated_fraction": round(sum(s.truncated for s in ws) / resp, 5),
        "trained_mean_length": round(trained_tokens / resp, 1),
        "capped_fraction": round(sum(s.capped for s in ws) / resp, 5),
        "truncated_fraction_per_epoch": [
            round(sum(s.truncated for s in run.steps if s.epoch == e)
                  / max(1, sum(s.responses for s in run.steps if s.epoch == e)), 5) for e in range(epochs)],
        "stale_token_fraction": round(sum(s.stale_tokens for s in ws) / max(1, trained_tokens), 5),
        "resumed_response_fraction": round(sum(s.resumed_responses for s in ws) / resp, 5),
        "resumed_group_fraction": round(float(np.mean(spans > 1)), 5),
        "max_policy_versions": int(versions.max()),
        "mean_policy_versions_resumed": (round(float(versions[versions > 1].mean()), 2) if (versions > 1).any()
                                         else 1.0),
        "restarted_groups": sum(s.restarted_groups for s in ws),
        "epoch0_speedup_vs_baseline": epoch0,
        "warm_started_rows": run.warm_rows,
        "preemptions_per_request": round(sum(s.preemptions for s in ws) / max(1, sum(s.requests for s in ws)), 5),
        "recomputed_tokens_fraction": round(sum(s.recomputed_tokens for s in ws) / max(1, sum(s.tokens for s in ws)),
                                            5),
        "prediction_rank_corr_per_epoch": quality("rank_corr"),
        "top_decile_hit_per_epoch": quality("top_decile_hit"),
        "prompts_trained_per_epoch": [int(len(np.unique(r))) for r in trained],
        "every_prompt_once_per_epoch": all(len(r) == num_rows and len(np.unique(r)) == num_rows for r in trained),
    }


def trace_lower_bound(trace: Trace, engine: EngineParams, batch_size: int) -> float:
    """Sum over the warm epochs of the any-order, no-cap epoch bound."""
    return round(sum(epoch_lower_bound(trace.lengths[e], batch_size, engine) for e in warm_epochs(trace.epochs)), 1)


def simulate(trace: Trace, policies: list[str], engine: EngineParams, *, batch_size: int, seed: int = 0,
             record_dir: str | None = None, previous: Trace | None = None, spec_cost: SpecCost | None = None) -> dict:
    """Run ``policies`` (baseline always runs, the ratios need it) and return the report's policy entries;
    ``record_dir`` receives ``<policy>.jsonl`` in the trainer's trace format (replaced if present). Warm-started
    policies seed from ``previous`` (default: ``trace.previous_run()`` for a generated trace). ``spec_cost``: the
    speculative-decoding cost model and acceptance length for policies that speculate (default ``SpecCost()``)."""
    if trace.num_prompts < batch_size:
        raise ValueError(f"{trace.num_prompts} prompts make no full batch of {batch_size}")
    unknown = [nm for nm in policies if nm not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    if previous is None and any(POLICIES[nm].warm_start != "none" for nm in policies):
        previous = trace.previous_run()
    # The trainer cuts the dataset to whole batches (drop_last); so does the simulator.
    trace = trace.subset(prompts=trace.num_prompts // batch_size * batch_size)
    names = list(dict.fromkeys(["baseline", *policies]))
    paths = {nm: None for nm in names}
    if record_dir:
        Path(record_dir).mkdir(parents=True, exist_ok=True)
        for nm in names:
            paths[nm] = Path(record_dir) / f"{nm}.jsonl"
            paths[nm].unlink(missing_ok=True)  # the writer appends
    runs = {nm: run_policy(trace, nm, engine, batch_size=batch_size, seed=seed, record_path=paths[nm],
                           previous=previous, spec_cost=spec_cost) for nm in names}
    base, oracle = runs["baseline"], runs.get("oracle")
    entries = [summarize(runs[nm], trace.epochs, trace.num_prompts, base, oracle) for nm in names
               if nm in policies or nm == "baseline"]
    return {"trace": trace, "policies": entries, "lower_bound_s": trace_lower_bound(trace, engine, batch_size)}
