"""The main command on a CPU, through verl's real loop: what one run of ``PRESET=cpu`` shows.

Read from the run's own artifacts: verl's file-logger metrics, the recipe's length traces, the console.
"""
import math

import numpy as np

from recipe.core.estimates import LengthEstimates
from recipe.core.step_stats import StepResponses
from recipe.cpu.preset import CPU_VALUES, N_TRAIN

BATCH, N = int(CPU_VALUES["TRAIN_BATCH_SIZE"]), int(CPU_VALUES["ROLLOUT_N"])
RESPONSE, EPOCHS = int(CPU_VALUES["MAX_RESPONSE_LENGTH"]), int(CPU_VALUES["TOTAL_EPOCHS"])
STEPS = EPOCHS * N_TRAIN // BATCH


def test_main_command_runs_the_cpu_preset_to_the_end(resampler_run):
    """The bare main command on a machine without a GPU (checkpoints on): the banner, the preflight, a progress line
    per step and where everything is, on a quiet console (Ray's, verl's and vLLM's lines go to the console log); the
    run directory with its metrics log, console log, traces and offline wandb run."""
    run_dir, out = resampler_run.run_dir, resampler_run.output
    assert "running the CPU preset (PRESET=cpu)" in out and "preflight: OK" in out
    assert len(out.splitlines()) < 150, f"{len(out.splitlines())} console lines"
    (console,) = (run_dir / "logs").glob("console.*.log")
    assert f"the run's full output goes to {console}" in out
    assert "Training from scratch" in console.read_text() and "Training from scratch" not in out
    assert resampler_run.experiment == "cpu-grpo-resampler-group"  # the run directory names the drafter
    assert len(list((run_dir / "logs").glob("metrics.*.jsonl"))) == 1
    assert (run_dir / "length_traces.jsonl").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*")), "wandb runs offline into the run directory"
    progress = [line for line in out.splitlines() if "[recipe] step " in line]
    steps = {int(line.split("[recipe] step ")[1].split("/")[0]) for line in progress}
    assert steps == set(range(1, STEPS + 1)) and f"step {STEPS}/{STEPS}" in progress[-1]
    assert out.rstrip().splitlines()[-1] == f"train_grpo.sh: finished with status 0; run dir {run_dir}"
    assert f"  metrics  {run_dir}/logs/metrics." in out and f"  report   bash scripts/compare_runs.sh" in out
    assert sorted(resampler_run.metrics()) == list(range(1, STEPS + 1))
    assert sorted(int(p.name.split("_")[-1]) for p in run_dir.glob("global_step_*")) == [4, 8, 12, 16, 18]


def test_every_prompt_trained_once_per_epoch_with_all_its_responses(resampler_run):
    traces = resampler_run.traces()
    assert sorted(traces) == list(range(1, STEPS + 1))
    by_epoch = {}
    for rec in traces.values():
        assert len(rec["lengths"]) == BATCH * N
        pairs = sorted(zip(rec["rows"], rec["sample_index"]))
        assert pairs == sorted((r, s) for r in set(rec["rows"]) for s in range(N))  # whole groups
        by_epoch.setdefault(rec["epoch"], []).extend(set(rec["rows"]))
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, rows in by_epoch.items():
        assert sorted(rows) == list(range(N_TRAIN)), f"epoch {epoch}"


def test_estimates_follow_every_trained_response(resampler_run):
    """Replaying the traces through the recipe's own estimator reproduces the prediction each batch was formed
    with: every trained response (and nothing else) was folded in, censored where it hit the cap or the limit."""
    est = LengthEstimates(N_TRAIN, ema_decay=float(CPU_VALUES.get("SAMPLER_EMA_DECAY", 0.7)), statistic="mean")
    checked = 0
    for step, rec in resampler_run.traces().items():
        rows = np.array(rec["rows"])
        predicted = np.array([np.nan if p is None else p for p in rec["predicted"]])
        expected = est.get(rows, fill_prior=False)
        assert np.array_equal(np.isnan(predicted), np.isnan(expected)), f"step {step}"
        assert np.allclose(predicted[~np.isnan(predicted)], expected[~np.isnan(expected)], atol=1e-3), f"step {step}"
        checked += int((~np.isnan(predicted)).sum())
        resp = StepResponses(rows=rows, lengths=rec["lengths"], caps=[rec["cap"] or 0] * len(rows),
                             predicted=predicted, response_length=rec["response_length"])
        est.update(rows, resp.lengths, resp.censored())
    assert checked == (EPOCHS - 1) * N_TRAIN * N  # from epoch 1 on, every response carried a prediction
    metrics = resampler_run.metrics()
    assert metrics[N_TRAIN // BATCH]["sampler/seen_ratio"] == 1.0


def test_the_cap_reaches_vllm(resampler_run):
    """From epoch 1 on each batch gets the seed cap min(response, max(min_tokens, factor x mean estimate)) and vLLM
    stops the responses there: the cap in the metrics is the one in the traces, no response is longer, and the
    random model, which rarely stops by itself, runs into it."""
    factor = float(CPU_VALUES["VLLM_ROLLOUT_EARLY_STOP_FACTOR"])
    floor = int(CPU_VALUES["VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS"])
    metrics, capped = resampler_run.metrics(), 0
    for step, rec in resampler_run.traces().items():
        cap = metrics[step]["rollout/response_max_tokens_cap"]
        if rec["epoch"] == 0:
            assert cap == 0 and rec["cap"] is None and all(p is None for p in rec["predicted"])
            continue
        want = min(RESPONSE, max(floor, math.ceil(factor * np.mean(rec["predicted"]))))
        assert want < RESPONSE and cap == rec["cap"] == want, f"step {step}"
        assert max(rec["lengths"]) <= cap and metrics[step]["response_length/max"] <= cap
        capped += sum(n == cap for n in rec["lengths"])
        assert metrics[step]["rollout/cap_hit_ratio"] == np.mean([n >= cap for n in rec["lengths"]])
    assert capped >= 0.9 * (EPOCHS - 1) * N_TRAIN * N


def test_reward_rises_and_rollout_follows_the_trainer(resampler_run):
    """The smoke task is learnt (last quarter's mean training reward above the first quarter's), and vLLM's
    log-probs match the trainer's at every step (verl's rollout_probs_diff): the weights reach vLLM after every
    update, MoE experts included (the vLLM CPU fix)."""
    metrics = resampler_run.metrics()
    score = np.array([metrics[s]["critic/score/mean"] for s in sorted(metrics)])
    quarter = len(score) // 4
    assert score[-quarter:].mean() > score[:quarter].mean() + 0.1, score.round(3).tolist()
    diff = np.array([metrics[s]["training/rollout_probs_diff_mean"] for s in sorted(metrics)])
    assert diff.max() < 1e-6, diff.tolist()
