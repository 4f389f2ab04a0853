"""The recipe's main command, ``bash scripts/train_grpo.sh``, run for real on this CPU (``PRESET=cpu``).

Each run is verl 0.9.1's own v1 loop: ``LengthAwareTaskRunner`` -> ``LengthAwareTrainer``, verl's FSDP engine, one
vLLM CPU replica started by verl (``vLLMHttpServer``), TransferQueue, verl's reward loop. The runs are expensive
(~3 min of start-up each), so each is a session fixture shared by the tests that read it. The runs the selected
tests need all start in the background once collection ends, ``RECIPE_E2E_PARALLEL`` at a time (default:
``default_slots``, one on this machine), while the session's other tests run (the e2e tests themselves go last:
tests/conftest.py); a fixture waits for its run (``harness.cpu_runs.RunPool``). Every run has a hard time
limit, and whatever it started (Ray, vLLM, FSDP workers) is found by a marker in the processes' environment and
killed when it ends, passes or not, and when the session ends: a hung run is a failed test, never a leak.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cpu_runs import REPO, Launcher, Run, RunPool, require_success

PARALLEL_ENV = "RECIPE_E2E_PARALLEL"

# The single-turn runs use the CPU preset's random model: their assertions (responses at the length limit, the cap
# halving them, a rising smoke reward) are written for it. The multi-turn runs use the trained one.
RANDOM_MODEL = {"CPU_MODEL": "random"}

# Checkpoints every 4 steps; the multi-turn resume run is killed mid-epoch 1 (steps 7-12) after global_step_8.
CHECKPOINTS = {"SAVE_CKPT_ENABLE": "1", "TRAINER_SAVE_FREQ": "4", "MAX_CKPT_TO_KEEP": "10"}
CHECKPOINT = 8

# Over-sampling: 10 groups launched per step (8 + 25%), vLLM runs 16 sequences at a time, so the groups that lose the
# race are still generating (or waiting) when they are aborted; one epoch and two steps into the next. A random
# model rarely stops by itself, so every response runs to the same limit: admitted in waves of 16, they would all
# finish in lockstep and a loser would be either complete or not started. 128 batched tokens a step (one context;
# whole prompts only on the CPU) admit a few requests per step, so the finishes spread and the losers are caught
# mid-response.
OVER_SAMPLE = {"OVER_SAMPLE_ENABLE": "1", "OVER_SAMPLE_RATIO": "0.25", "ROLLOUT_MAX_NUM_SEQS": "16",
               "ROLLOUT_MAX_NUM_BATCHED_TOKENS": "128", "TOTAL_EPOCHS": "2", **RANDOM_MODEL}
OVER_SAMPLE_STEPS = 8

# Speculative decoding and token records in both single-turn arms (lossless instruments: the A/B report sees no
# difference but the arms' own switches): the recipe's group drafter (vLLM's custom_class proposer over recipe/drafting:
# the request's context, its GRPO siblings, the prompt's earlier responses), matches of up to 8 tokens, at every batch
# size (vLLM's own ngram runs through the engine tests, tests/spec), and every trained response's token ids.
SPECULATIVE = {"ROLLOUT_SPECULATIVE": "group", "ROLLOUT_SPECULATIVE_MAX_BATCH": "0",
               "ROLLOUT_SPECULATIVE_SUFFIX_DEPTH": "8", "ROLLOUT_SPECULATIVE_SUFFIX_CACHED": "1000",
               "RECORD_TOKENS": "1"}


# Multi-turn (MULTI_TURN=1: the trained tiny model on calculator problems through CappedToolAgentLoop). The calculator
# answers after a sandboxed process has slept TOOL_LATENCY_S (tests/support/harness/slow_tool.py), so a step's aborts find
# trajectories in a tool call as well as mid-turn; every call's start and end go to the run's tool_events.jsonl.
TOOL_LATENCY_S = 1.5
MULTI_TURN_STEPS = 8
# In the over-sample run, 1 call in 16 takes 6 s: a step's calls start together and, all 1.5 s, end together before
# its last answers, so the abort (8 of 10 groups done, ~4 s into the step) found none in flight in one CI run of
# three. A step has ~28 calls: most steps have one or two slow ones, whose groups are then the two left to abort.
SLOW_TOOL = {"slow_share": 1 / 16, "slow_latency_s": 6.0}


def _multi_turn(name: str, extra: dict, args: tuple = (), slow: dict | None = None):
    def prepare(launcher: Launcher):
        from harness.slow_tool import slow_tool_config

        tools = slow_tool_config(launcher.base / name, TOOL_LATENCY_S, **(slow or {}))

        def job(launcher: Launcher) -> Run:
            # verl's dump of each step's trained text (beside the run's directory: Launcher.run finds the
            # experiment as the one directory under its own)
            dumps = launcher.base / f"{name}-rollouts"
            run = launcher.run(name, {"MULTI_TURN": "1", "TOOL_CONFIG": str(tools), "TOTAL_EPOCHS": "2", **extra},
                               args=(f"trainer.total_training_steps={MULTI_TURN_STEPS}",
                                     f"trainer.rollout_data_dir={dumps}", *args))
            run.tool_events, run.tool_latency_s, run.steps = tools.parent / "tool_events.jsonl", TOOL_LATENCY_S, \
                MULTI_TURN_STEPS
            run.slow_latency_s = (slow or {}).get("slow_latency_s", TOOL_LATENCY_S)
            run.dumps = dumps
            return run

        return job

    return prepare


# The multi-turn preset as a user runs it (the real calculator, in the sandbox), with checkpoints, killed with
# SIGKILL mid-epoch after global_step_8 and relaunched: resumption, and whether 18 steps of GRPO teach the policy to
# call the tool. It drafts with the preset's tiny EAGLE-3 head learning online (lossless: the policy's samples are
# the same in law), so the same kill and relaunch show the head saved and resumed with the run.
EAGLE3_ONLINE = {"ROLLOUT_SPECULATIVE": "eagle3", "ROLLOUT_DRAFT_ONLINE": "1", "ROLLOUT_DRAFT_LR": "1e-3"}
MT_RESUME = {"MULTI_TURN": "1", **CHECKPOINTS, "EXPERIMENT_NAME": "mt-resume", **EAGLE3_ONLINE}


def _multi_turn_resume(launcher: Launcher) -> Run:
    return launcher.kill_and_relaunch("mt-resume", MT_RESUME, experiment="mt-resume", checkpoint=CHECKPOINT)


def _resampler(launcher: Launcher) -> Run:
    return launcher.run("resampler", {**CHECKPOINTS, **RANDOM_MODEL, **SPECULATIVE, "RECIPE_CONSOLE": "quiet"},
                        experiment="cpu-grpo-resampler-group")


def _baseline(launcher: Launcher) -> Run:
    return launcher.run("baseline", {"BASELINE_NO_RESAMPLE": "1", **CHECKPOINTS, **RANDOM_MODEL, **SPECULATIVE})


# A user's own inputs, in the weight-sync control run (its claims hold for any data and reward): the preset's
# prompts as a plain-text column and their answers in another (PROMPT_KEY, ANSWER_KEY), the smoke reward as a
# function of the user's file (REWARD_FUNCTION_PATH/NAME), and LOGGER=console. The user's reward is 0.5 + half the
# preset's (GRPO's advantages are the same), so a score below 0.5 would be the preset's reward, not the user's.
USER_REWARD = ("def digits(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
               "    return 0.5 + 0.5 * sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n")


def _user_inputs(base: Path) -> dict:
    import pandas as pd

    from recipe.cpu.preset import N_TEST, N_TRAIN
    from recipe.tiny.artifacts import tiny_artifacts

    art, env = tiny_artifacts(os.environ.get("RECIPE_FIXTURE_CACHE") or None, n_train=N_TRAIN, n_test=N_TEST), {}
    base.mkdir(parents=True, exist_ok=True)
    for var, source in (("TRAIN_FILE", art.train_parquet), ("TEST_FILE", art.test_parquet)):
        rows = pd.read_parquet(source)
        pd.DataFrame({"question": [p[0]["content"] for p in rows["prompt"]],
                      "solution": [r["ground_truth"] for r in rows["reward_model"]]}).to_parquet(env.setdefault(
                          var, str(base / f"{var.lower()}.parquet")))
    (base / "my_reward.py").write_text(USER_REWARD)
    return {**env, "PROMPT_KEY": "question", "ANSWER_KEY": "solution", "REWARD_FUNCTION_PATH": str(base /
            "my_reward.py"), "REWARD_FUNCTION_NAME": "digits", "LOGGER": "console"}


def _restart_without_sync(launcher: Launcher):
    """The control driver's command is composed here, in the main thread (the preflight composes verl's config with
    Hydra, whose global state the session's other tests use); the run itself starts later, in a pool thread."""
    from recipe.cpu.preset import CONFIG_NAME, PLATFORM_ENV
    from recipe.preflight import run_preflight

    env = {"PRESET": "cpu", "CKPT_ROOT": str(launcher.base / "restart-no-sync"), "EXPERIMENT_NAME": "restart-no-sync",
           "RECIPE_FIXTURE_CACHE": os.environ.get("RECIPE_FIXTURE_CACHE", ""), **OVER_SAMPLE,
           "OVER_SAMPLE_REQUEUE": "restart", **_user_inputs(launcher.base / "user-inputs")}
    report = run_preflight(env=env)
    assert report.ok, report.errors
    cmd = [sys.executable, str(REPO / "tests" / "e2e" / "no_weight_sync_driver.py"), "--config-name", CONFIG_NAME,
           *report.overrides, f"trainer.total_training_steps={OVER_SAMPLE_STEPS}", "recipe.over_sample.abort_events=1"]
    return lambda launcher: launcher.run_command("restart-no-sync", cmd, {**PLATFORM_ENV, "PYTHONPATH": str(REPO)},
                                                 experiment="restart-no-sync")


# fixture name -> (called in the main thread) -> the job a pool thread runs, in the order the pool starts them: the
# random model's runs first, while the trained model the multi-turn runs need is built beside them
# (:func:`_build_trained_model`), then the longest of the rest (the multi-turn resume run is two launches).
JOBS = {"resampler_run": lambda launcher: _resampler, "baseline_run": lambda launcher: _baseline,
        "restart_without_sync_run": _restart_without_sync,
        "multi_turn_resume_run": lambda launcher: _multi_turn_resume,
        "multi_turn_os_run": _multi_turn("mt-os", {"OVER_SAMPLE_ENABLE": "1", "OVER_SAMPLE_RATIO": "0.25",
                                                   "OVER_SAMPLE_REQUEUE": "continue",
                                                   "ROLLOUT_SCHEDULING_POLICY": "priority"},
                                         args=("recipe.over_sample.abort_events=1",), slow=SLOW_TOOL),
        "multi_turn_tail_cut_run": _multi_turn("mt-tail-cut", {"TAIL_CUT_ENABLE": "1", "TAIL_CUT_FRACTION": "0.6",
                                                               "TAIL_CUT_LEVEL_EXPONENT": "0",
                                                               "SAMPLER_ORDER_BY": "time"})}
TRAINED_MODEL_JOBS = {"multi_turn_resume_run", "multi_turn_os_run", "multi_turn_tail_cut_run"}
_session: dict = {}


def _build_trained_model(launcher: Launcher) -> subprocess.Popen:
    """Start building the multi-turn preset's fixtures (the trained tiny model: ~8 CPU-minutes) in the background.
    Left to the first multi-turn launch, the build held up every launch after it (its preflight waited ~10 min on a
    loaded machine); built beside the random model's runs, it is ready when they are done. The fixture lock makes the
    preflight (or a test) wait for this build, or build itself if this one failed."""
    build = "from recipe.cpu.preset import cpu_env; cpu_env({'MULTI_TURN': '1'})"
    with (launcher.base / "trained-model-build.log").open("w") as log:
        return subprocess.Popen([sys.executable, "-c", build], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO)})


# The runs of the quick tier (``bash scripts/test.sh``): the main command on the single-turn preset (sampler, cap,
# estimates, checkpoints, the group drafter through verl's loop, token records) and a multi-turn run that calls the
# sandboxed tool and cuts its steps' tails. ``--tier=full`` (``.ci/run``) adds the rest: the fair baseline and the A/B
# report, the weight-sync control with over-sample restart, over-sample continue single- and multi-turn, and the
# multi-turn preset killed and relaunched.
QUICK_RUNS = {"resampler_run", "multi_turn_tail_cut_run"}


def pytest_collection_modifyitems(config, items):
    quick = config.getoption("--tier") == "quick"
    deselected = []
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.e2e)
            if quick and not _runs_needed(item) <= QUICK_RUNS:
                deselected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def _runs_needed(item) -> set[str]:
    """The runs a test reads: its fixtures, and run fixtures it takes as a parameter (``os_run``)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return {name for name in JOBS if name in getattr(item, "fixturenames", ()) or name in params.values()}


def default_slots() -> int:
    """Runs at once: one per 2 cores and per 8 GiB (a run peaks at ~2 cores and ~7 GiB). One on a 2-core machine,
    where a run is CPU-bound: two side by side, with the other tests, took 23.6 min for the suite, one after the
    other 22.3."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min((os.cpu_count() or 1) // 2, int(mem_gib // 8)))


def pytest_collection_finish(session):
    """Start, in the background, every run the selected tests need (nothing when no e2e test is selected). Under
    pytest-xdist every worker collects every test: the runs start in the worker that gets the e2e group, at its first
    test (the group goes first there, tests/conftest.py)."""
    needed = set().union(*(_runs_needed(item) for item in session.items))
    if not needed or session.config.option.collectonly:
        return
    slots = os.environ.get(PARALLEL_ENV) or str(default_slots())
    if not slots.isdigit() or int(slots) < 1:
        raise pytest.UsageError(f"{PARALLEL_ENV}={slots!r}: set it to how many e2e runs may run at once (>= 1)")
    if hasattr(session.config, "workerinput"):
        _session["lazy"] = (session.config, needed, int(slots))
    else:
        _start_runs(session.config, needed, int(slots))


def _start_runs(config, needed: set[str], slots: int) -> None:
    launcher = Launcher(config._tmp_path_factory.mktemp("e2e"))  # tmp_path_factory (no fixtures in a hook)
    pool = RunPool(launcher, slots)
    # a SIGTERM to pytest (a CI timeout) ends the session, and with it every run's processes
    _session.update(pool=pool, sigterm=signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM)))
    if needed & TRAINED_MODEL_JOBS:
        _session["build"] = _build_trained_model(launcher)
    for name, prepare in JOBS.items():
        if name in needed:
            pool.submit(name, prepare(launcher))


def pytest_sessionfinish(session):
    if "build" in _session and _session["build"].poll() is None:
        _session["build"].kill()
    _session.pop("build", None)
    if "pool" in _session:
        left = _session.pop("pool").close()
        signal.signal(signal.SIGTERM, _session.pop("sigterm"))
        if left:
            pytest.exit(f"e2e runs left processes alive after SIGKILL: {left}", returncode=pytest.ExitCode.TESTS_FAILED)


def _result(name: str) -> Run:
    if "pool" not in _session and "lazy" in _session:
        _start_runs(*_session.pop("lazy"))
    if "pool" not in _session:
        raise RuntimeError(f"{name}: the e2e runs were not started (tests/e2e/conftest.py pytest_collection_finish)")
    return require_success(_session["pool"].result(name))


@pytest.fixture(scope="session")
def resampler_run() -> Run:
    """The main command without a GPU (the CPU preset on its random model, quiet console, checkpoints), one launch to
    the end, with the recipe's group drafter through verl's loop and its acceptance metrics from vLLM's counters
    (``SPECULATIVE``, tests/e2e/test_speculative.py) and every trained response's token ids recorded for the
    acceptance estimator (``RECORD_TOKENS=1``): speculation is lossless, so the sampler's, the cap's and the
    trainer's claims are unchanged. Resumption is ``multi_turn_resume_run``'s (full tier): one killed launch proves
    it for both presets (the sampler, the checkpoint and verl's resume are the same code; each launch costs minutes
    of start-up)."""
    return _result("resampler_run")


@pytest.fixture(scope="session")
def baseline_run() -> Run:
    """The fair baseline arm: verl's seeded random order, no cap, everything else as the resampler run."""
    return _result("baseline_run")


@pytest.fixture(scope="session")
def multi_turn_os_run() -> Run:
    """``MULTI_TURN=1`` with over-sample ``continue`` (vLLM priority scheduling, as in ``continue_run``) and a
    calculator that takes TOOL_LATENCY_S in a sandboxed process, a few calls far longer (SLOW_TOOL): aborts catch
    trajectories mid-turn and mid-tool, and the next step resumes them. ``run.tool_events``: every tool call's start
    and end; ``run.abort_events()``: when each group was aborted, with its partial texts; ``run.dumps``: the trained
    text."""
    return _result("multi_turn_os_run")


@pytest.fixture(scope="session")
def multi_turn_resume_run() -> Run:
    """``MULTI_TURN=1`` as the main command runs it (18 steps, the recipe's calculator in the sandbox) with
    checkpoints, killed with SIGKILL mid-epoch after ``global_step_8`` and step 10, then relaunched with the same
    command: the relaunch resumes through verl's checkpoint manager and runs to the end. ``run.killed`` is the first
    launch (its output and its traces as they were at the kill, i.e. the uninterrupted steps after the
    checkpoint)."""
    return _result("multi_turn_resume_run")


@pytest.fixture(scope="session")
def multi_turn_tail_cut_run() -> Run:
    """``MULTI_TURN=1`` with the tail cut at 60% of a step's trajectories and the same slow calculator: the cut
    catches trajectories in a tool call and between turns; the step must still end (no deadlock). Its epochs are
    ordered by expected time (``SAMPLER_ORDER_BY=time``), which no other launch exercises."""
    return _result("multi_turn_tail_cut_run")


@pytest.fixture(scope="session")
def restart_without_sync_run() -> Run:
    """Three claims in one run (each launch costs minutes of start-up): over-sample ``restart`` on verl's real server,
    the weight push to vLLM removed (tests/e2e/no_weight_sync_driver.py: the same composed config and TaskRunner
    as the main command, the trainer without verl's update_weights), and a user's own data, reward and logger
    (``_user_inputs``)."""
    return _result("restart_without_sync_run")
