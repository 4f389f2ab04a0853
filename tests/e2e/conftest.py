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


@pytest.fixture(scope="session")
def resampler_run(launcher) -> Run:
    """The main command as a user runs it without a GPU (the CPU preset), saving a checkpoint every 4 steps so that
    it is also the uninterrupted reference of the kill -9 resume test."""
    return require_success(launcher.run("resampler", {"SAVE_CKPT_ENABLE": "1", "TRAINER_SAVE_FREQ": "4",
                                                      "MAX_CKPT_TO_KEEP": "10"}))


@pytest.fixture(scope="session")
def baseline_run(launcher) -> Run:
    """The fair baseline arm: verl's seeded random order, no cap, everything else as the resampler run."""
    return require_success(launcher.run("baseline", {"BASELINE_NO_RESAMPLE": "1", "SAVE_CKPT_ENABLE": "1",
                                                     "TRAINER_SAVE_FREQ": "4", "MAX_CKPT_TO_KEEP": "10"}))
