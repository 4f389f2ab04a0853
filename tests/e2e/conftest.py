"""The recipe's main command, ``bash scripts/train_grpo.sh``, run for real on this CPU (``PRESET=cpu``).

Each run is verl 0.9.1's own v1 loop: ``LengthAwareTaskRunner`` -> ``LengthAwareTrainer``, verl's FSDP engine, one
vLLM CPU replica started by verl (``vLLMHttpServer``), TransferQueue, verl's reward loop. The runs are expensive
(~1 min of start-up each), so each is a session fixture shared by the tests that read it, started on first use.
Every run has a hard time limit, and whatever it started (Ray, vLLM, FSDP workers) is found by a marker in the
processes' environment and killed when it ends, passes or not (``recipe/testing/cpu_runs.py``): a hung run is a
failed test, never a leak.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from recipe.testing.cpu_runs import Launcher, Run, require_success


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def launcher(tmp_path_factory):
    """Runs share one launcher; a SIGTERM to pytest (a CI timeout) still ends every run's processes."""
    launcher = Launcher(tmp_path_factory.mktemp("e2e"))
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        yield launcher
    finally:
        signal.signal(signal.SIGTERM, previous)
        launcher.cleanup()


def require_success(run: Run) -> Run:
    assert run.returncode == 0, f"run failed ({run.returncode}); last output:\n{run.output[-6000:]}"
    return run


# Checkpoints every 4 steps; the resampler run is killed mid-epoch 1 (steps 7-12) after global_step_8.
CHECKPOINTS = {"SAVE_CKPT_ENABLE": "1", "TRAINER_SAVE_FREQ": "4", "MAX_CKPT_TO_KEEP": "10"}
CHECKPOINT, KILL_AFTER_STEP = 8, 10


@pytest.fixture(scope="session")
def resampler_run(launcher) -> Run:
    """The main command as a user runs it without a GPU (the CPU preset, with checkpoints), killed with SIGKILL
    mid-epoch after a checkpoint and relaunched with the same command: the relaunch resumes through verl's
    checkpoint manager and runs to the end. ``run.killed`` is the first launch (its output and its traces as they
    were at the kill, i.e. the uninterrupted steps after the checkpoint)."""
    return require_success(launcher.kill_and_relaunch("resampler", CHECKPOINTS, experiment="cpu-grpo-resampler",
                                                      checkpoint=CHECKPOINT, kill_after_step=KILL_AFTER_STEP))


@pytest.fixture(scope="session")
def baseline_run(launcher) -> Run:
    """The fair baseline arm: verl's seeded random order, no cap, everything else as the resampler run."""
    return require_success(launcher.run("baseline", {"BASELINE_NO_RESAMPLE": "1", **CHECKPOINTS}))


# Over-sampling: 10 groups launched per step (8 + 25%), vLLM runs 16 sequences at a time, so the groups that lose the
# race are still generating (or waiting) when they are aborted; one epoch and two steps into the next. A random
# model rarely stops by itself, so every response runs to the same limit: admitted in waves of 16, they would all
# finish in lockstep and a loser would be either complete or not started. 128 batched tokens a step (one context;
# whole prompts only on the CPU) admit a few requests per step, so the finishes spread and the losers are caught
# mid-response.
OVER_SAMPLE = {"OVER_SAMPLE_ENABLE": "1", "OVER_SAMPLE_RATIO": "0.25", "ROLLOUT_MAX_NUM_SEQS": "16",
               "ROLLOUT_MAX_NUM_BATCHED_TOKENS": "128", "TOTAL_EPOCHS": "2"}
OVER_SAMPLE_STEPS = 8


@pytest.fixture(scope="session")
def continue_run(launcher) -> Run:
    """Over-sample ``continue`` (partial rollout) through the main command, without a cap as the off-policy ``best``
    policy runs (a resumed response already past the next step's cap would be trained as it is, never continued),
    and with vLLM priority scheduling, which admits the resumed groups first: under FCFS their requests reach vLLM
    after the fresh ones (each first reads its partial from TransferQueue) and often lose the next race too. verl dumps the trained text of every step (``trainer.rollout_data_dir``) and the driver writes one event per
    aborted group."""
    dumps = launcher.base / "os-continue" / "rollouts"
    run = launcher.run("os-continue", {**OVER_SAMPLE, "OVER_SAMPLE_REQUEUE": "continue",
                                       "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "0", "ROLLOUT_SCHEDULING_POLICY": "priority"},
                       args=(f"trainer.total_training_steps={OVER_SAMPLE_STEPS}", "recipe.over_sample.abort_events=1",
                             f"trainer.rollout_data_dir={dumps}"), experiment="cpu-grpo-resampler-nocap-os")
    run.dumps = dumps
    return require_success(run)


@pytest.fixture(scope="session")
def restart_without_sync_run(launcher) -> Run:
    """Two controls in one run (each launch costs a minute of start-up): over-sample ``restart`` on verl's real
    server, and the weight push to vLLM removed (tests/e2e/no_weight_sync_driver.py: the same composed config and
    TaskRunner as the main command, the trainer without verl's update_weights)."""
    import os

    from recipe.cpu.preset import CONFIG_NAME, PLATFORM_ENV
    from recipe.preflight import run_preflight
    from recipe.testing.cpu_runs import REPO

    env = {"PRESET": "cpu", "CKPT_ROOT": str(launcher.base / "restart-no-sync"), "EXPERIMENT_NAME": "restart-no-sync",
           "RECIPE_FIXTURE_CACHE": os.environ.get("RECIPE_FIXTURE_CACHE", ""), **OVER_SAMPLE,
           "OVER_SAMPLE_REQUEUE": "restart"}
    report = run_preflight(env=env)
    assert report.ok, report.errors
    cmd = [sys.executable, str(REPO / "tests" / "e2e" / "no_weight_sync_driver.py"), "--config-name", CONFIG_NAME,
           *report.overrides, f"trainer.total_training_steps={OVER_SAMPLE_STEPS}", "recipe.over_sample.abort_events=1"]
    return require_success(launcher.run_command("restart-no-sync", cmd, {**PLATFORM_ENV, "PYTHONPATH": str(REPO)},
                                                experiment="restart-no-sync"))
