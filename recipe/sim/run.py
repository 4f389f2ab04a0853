"""The simulation driver: replay a trace through a policy and the engine model, and summarise the result.

Per step: the policy plans rows (+ cap, + how many groups to keep); each launched response generates
``min(desired, cap, response_length)`` tokens on the engine model; with over-sampling the step ends when the
``keep``-th group completes and the other requests are aborted with the tokens they had; the kept groups go back
to the policy as the trainer would feed them. Epoch 0 has no estimates, so ratios are computed over later epochs.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recipe.traces import LengthTraceWriter, finish_reasons

from .engine import EngineParams, epoch_lower_bound, simulate_step, step_lower_bound
from .policies import POLICIES, Policy, make_policy
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


@dataclass
class PolicyRun:
    name: str
    spec: dict
    steps: list[StepRecord] = field(default_factory=list)


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
        limit = np.where(plan.caps > 0, np.minimum(plan.caps, response_length), response_length)
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


class ModelExecutor:
    """Runs a step on the engine model (``engine.simulate_step``). The replay in ``bench/rollout_replay.py``
    swaps in a real vLLM engine behind the same ``run_step``; everything else (policy, controller, plan,
    bookkeeping) is shared."""

    def __init__(self, engine: EngineParams, seed: int = 0):
        self.engine, self.seed = engine, seed

    def run_step(self, policy: Policy, plan, launch: StepLaunch, *, epoch: int, global_step: int) -> StepResult:
        todo = launch.todo
        live = todo > 0
        timing = simulate_step(todo[live], self.engine, np.random.default_rng([self.seed, epoch, global_step]),
                               context0=self.engine.prompt_len + launch.have[live])
        finish = np.zeros(todo.shape)
        finish[live] = timing.finish_time
        kept, t_end = np.ones(len(plan.rows), bool), timing.time_s
        if plan.keep is not None:
            kept = policy.oversample.select(finish.max(axis=1))
            t_end = float(finish.max(axis=1)[kept].max())
        if policy.tail_cut:
            t_end = min(t_end, policy.tail_cut.cut_time(finish[kept]))
        now = todo.copy()
        if t_end < timing.time_s:
            now[live] = np.minimum(timing.tokens_by(t_end), todo[live])
        return StepResult(now=now, kept=kept, time_s=t_end,
                          lower_bound_s=step_lower_bound(now[live], self.engine))


def iter_policy(trace: Trace, name: str, executor, *, batch_size: int, seed: int = 0,
                record_path: str | Path | None = None, run: PolicyRun | None = None) -> Iterator[StepRecord]:
    """Replay every epoch of ``trace`` under policy ``name`` on ``executor``, one ``StepRecord`` per step (appended
    to ``run.steps`` when given); optionally write the trainer's JSONL trace. A generator, so a benchmark can
    interleave several policies step by step on one engine.

    Over-sampling: a group the controller restarts (``restart`` mode, or ``continue`` past ``max_resumes``) draws
    fresh responses when launched again (``Trace.attempt_lengths``) and its aborted tokens are wasted; a group it
    resumes (``continue``) keeps its partial responses, which go on where they stopped in the next launch
    (prompt + partial response, the rest of the length), and a finished response of such a group is kept as it is.
    """
    policy: Policy = make_policy(name, num_rows=trace.num_prompts, batch_size=batch_size,
                                 response_length=trace.response_length, seed=seed, truth=trace.lengths)
    writer = LengthTraceWriter(record_path) if record_path else None
    global_step = 0
    try:
        for epoch in range(trace.epochs):
            policy.start_epoch(epoch)
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
                    restarted_groups=int((~kept & ~plan.keep_partial).sum()), max_decoded=int(now.max(initial=0)))
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
               record_path: str | Path | None = None) -> PolicyRun:
    """Replay every epoch of ``trace`` under policy ``name`` on the engine model (see ``iter_policy``)."""
    out = PolicyRun(name=name, spec=POLICIES[name].to_dict() if name in POLICIES else {})
    for _ in iter_policy(trace, name, ModelExecutor(engine, seed), batch_size=batch_size, seed=seed,
                         record_path=record_path, run=out):
        pass
    return out


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
        "prompts_trained_per_epoch": [int(len(np.unique(r))) for r in trained],
        "every_prompt_once_per_epoch": all(len(r) == num_rows and len(np.unique(r)) == num_rows for r in trained),
    }


def trace_lower_bound(trace: Trace, engine: EngineParams, batch_size: int) -> float:
    """Sum over the warm epochs of the any-order, no-cap epoch bound."""
    return round(sum(epoch_lower_bound(trace.lengths[e], batch_size, engine) for e in warm_epochs(trace.epochs)), 1)


def simulate(trace: Trace, policies: list[str], engine: EngineParams, *, batch_size: int, seed: int = 0,
             record_dir: str | None = None) -> dict:
    """Run ``policies`` (baseline always runs, the ratios need it) and return the report's policy entries;
    ``record_dir`` receives ``<policy>.jsonl`` in the trainer's trace format (replaced if present)."""
    if trace.num_prompts < batch_size:
        raise ValueError(f"{trace.num_prompts} prompts make no full batch of {batch_size}")
    # The trainer cuts the dataset to whole batches (drop_last); so does the simulator.
    trace = trace.subset(prompts=trace.num_prompts // batch_size * batch_size)
    names = list(dict.fromkeys(["baseline", *policies]))
    paths = {nm: None for nm in names}
    if record_dir:
        Path(record_dir).mkdir(parents=True, exist_ok=True)
        for nm in names:
            paths[nm] = Path(record_dir) / f"{nm}.jsonl"
            paths[nm].unlink(missing_ok=True)  # the writer appends
    runs = {nm: run_policy(trace, nm, engine, batch_size=batch_size, seed=seed, record_path=paths[nm]) for nm in names}
    base, oracle = runs["baseline"], runs.get("oracle")
    entries = [summarize(runs[nm], trace.epochs, trace.num_prompts, base, oracle) for nm in names
               if nm in policies or nm == "baseline"]
    return {"trace": trace, "policies": entries, "lower_bound_s": trace_lower_bound(trace, engine, batch_size)}
