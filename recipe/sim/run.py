"""The simulation driver: replay a trace through a policy and the engine model, and summarise the result.

Per step: the policy plans rows (+ cap, + how many groups to keep); each launched response generates
``min(desired, cap, response_length)`` tokens on the engine model; with over-sampling the step ends when the
``keep``-th group completes and the other requests are aborted with the tokens they had; the kept groups go back
to the policy as the trainer would feed them. Epoch 0 has no estimates, so ratios are computed over later epochs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recipe.traces import LengthTraceWriter, finish_reasons

from .engine import EngineParams, epoch_lower_bound, simulate_step, step_lower_bound
from .policies import Policy, make_policy
from .trace import Trace


@dataclass
class StepRecord:
    epoch: int
    time_s: float
    lower_bound_s: float
    tokens: int  # decoded, including aborted work
    wasted_tokens: int  # decoded for groups that were aborted and will be generated again
    trained_rows: np.ndarray
    responses: int  # trained responses
    truncated: int  # trained responses cut by the cap or response_length
    capped: int  # ... of which by the cap
    caps: np.ndarray  # per launched row, 0 = none
    spans: np.ndarray  # per trained group: policy versions its responses were generated with (>1: partial rollout)


@dataclass
class PolicyRun:
    name: str
    spec: dict
    steps: list[StepRecord] = field(default_factory=list)


def run_policy(trace: Trace, name: str, engine: EngineParams, *, batch_size: int, seed: int = 0,
               record_path: str | Path | None = None) -> PolicyRun:
    """Replay every epoch of ``trace`` under policy ``name``; optionally write the trainer's JSONL trace.

    Over-sampling: in ``restart`` mode a re-launched prompt draws fresh responses (``Trace.attempt_lengths``) and
    the aborted tokens are wasted; in ``continue`` mode (partial rollout) its responses resume where they stopped,
    re-prefilling prompt + partial response, and nothing is wasted.
    """
    policy: Policy = make_policy(name, num_rows=trace.num_prompts, batch_size=batch_size,
                                 response_length=trace.response_length, seed=seed, truth=trace.lengths)
    spec = policy.spec
    resume = spec.oversample_ratio > 0 and spec.oversample_requeue == "continue"
    out = PolicyRun(name=name, spec=spec.to_dict())
    writer = LengthTraceWriter(record_path) if record_path else None
    limit_rl, n = trace.response_length, trace.n
    global_step = 0
    try:
        for epoch in range(trace.epochs):
            policy.start_epoch(epoch)
            launches = np.zeros(trace.num_prompts, np.int64)  # restart: which draw a re-launch gets
            partial: dict[int, np.ndarray] = {}  # continue: tokens an aborted row's responses already have
            first_step: dict[int, int] = {}  # continue: the step an aborted row's responses started in
            while not policy.epoch_finished():
                plan = policy.plan_step()
                rows = plan.rows
                limit = np.where(plan.caps > 0, np.minimum(plan.caps, limit_rl), limit_rl)
                desired = trace.attempt_lengths(epoch, rows, np.zeros_like(rows) if resume else launches[rows])
                launches[rows] += 1
                have = np.stack([partial.pop(int(r), np.zeros(n, np.int64)) for r in rows])
                target = np.maximum(np.minimum(desired, limit[:, None]), have)  # (rows, n) final lengths
                todo = target - have
                live = todo > 0
                timing = simulate_step(todo[live], engine, np.random.default_rng([seed, epoch, global_step]),
                                       context0=engine.prompt_len + have[live])
                finish = np.zeros(todo.shape)
                finish[live] = timing.finish_time
                kept, t_end = np.ones(len(rows), bool), timing.time_s
                if plan.keep is not None:
                    kept = policy.oversample.select(finish.max(axis=1))
                    t_end = float(finish.max(axis=1)[kept].max())
                if policy.tail_cut:
                    t_end = min(t_end, policy.tail_cut.cut_time(finish[kept]))
                now = todo.copy()
                if t_end < timing.time_s:
                    now[live] = np.minimum(timing.tokens_by(t_end), todo[live])
                produced = have + now
                stopped = produced < target
                if resume:
                    partial.update((int(r), produced[i]) for i, r in enumerate(rows) if not kept[i])
                    for r in rows[~kept]:
                        first_step.setdefault(int(r), global_step)
                resp = policy.observe(plan, produced, kept, stopped)
                trunc = resp.censored()
                out.steps.append(StepRecord(
                    epoch=epoch, time_s=t_end, lower_bound_s=step_lower_bound(now[live], engine),
                    tokens=int(now.sum()), wasted_tokens=0 if resume else int(now[~kept].sum()),
                    trained_rows=rows[kept], responses=int(resp.lengths.size), truncated=int(trunc.sum()),
                    capped=int(resp.cap_hit().sum()), caps=plan.caps,
                    spans=np.array([global_step - first_step.pop(int(r), global_step) + 1 for r in rows[kept]])))
                global_step += 1
                if writer:
                    _record(writer, trace, epoch, global_step, plan, produced, stopped, t_end)
    finally:
        if writer:
            writer.close()
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
    was aborted); ``resumed_group_fraction``: trained groups whose responses were generated
    over several steps, i.e. by several policy versions (partial rollout only), and how many versions at most / on
    average among those; ``truncated_fraction`` is the share of trained responses that did not end with EOS (limit, cap
    or tail cut); ``lower_bound_s`` sums, over this policy's steps, the bound for decoding what each step decoded.
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
        "time_vs_lower_bound": round(total / sum(s.lower_bound_s for s in ws), 4),
        "step_time_p50_s": round(float(np.percentile(times, 50)), 1),
        "step_time_p95_s": round(float(np.percentile(times, 95)), 1),
        "step_time_max_s": round(float(times.max()), 1),
        "steps_per_epoch": [sum(1 for s in run.steps if s.epoch == e) for e in range(epochs)],
        "tokens_per_s": round(sum(s.tokens for s in ws) / total, 1),
        "wasted_tokens_fraction": round(sum(s.wasted_tokens for s in ws) / max(1, sum(s.tokens for s in ws)), 4),
        "truncated_fraction": round(sum(s.truncated for s in ws) / resp, 5),
        "capped_fraction": round(sum(s.capped for s in ws) / resp, 5),
        "truncated_fraction_per_epoch": [
            round(sum(s.truncated for s in run.steps if s.epoch == e)
                  / max(1, sum(s.responses for s in run.steps if s.epoch == e)), 5) for e in range(epochs)],
        "resumed_group_fraction": round(float(np.mean(spans > 1)), 5),
        "max_policy_versions": int(spans.max()),
        "mean_policy_versions_resumed": round(float(spans[spans > 1].mean()), 2) if (spans > 1).any() else 1.0,
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
