"""The user's variables in the preflight (recipe/preflight/env.py, knobs.py): a misspelled one is refused by name,
every problem comes in one report, a variable with no effect (or that replaces a preset's value) is named,
``--print-env`` shows what the run would use, and the summary's short table lists the levers that are on."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.preflight import format_report, run_preflight
from recipe.preflight.env import declared_names, unknown_variables
from recipe.preflight.knobs import FOREIGN_PREFIXES, REAL_RUN_INPUTS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, nearest", [
    ("SAVE_CKPT_ENABLED", "SAVE_CKPT_ENABLE"),  # a declared prefix
    ("VLLM_ROLLOUT_EARLY_STOP_FACTR", "VLLM_ROLLOUT_EARLY_STOP_FACTOR"),
    ("ROLLOUT_SPECULATIV", "ROLLOUT_SPECULATIVE"),
    ("TRAIN_FLIE", "TRAIN_FILE"),  # close: a transposition
    ("NNODE", "NNODES"),
    ("DISTCP_PTH", "DISTCP_PATH"),
])
def test_a_recipe_like_unknown_variable_is_refused_with_the_nearest(name, nearest):
    (error,) = unknown_variables({name: "1"})
    assert error.startswith(f"{name} is set but the recipe reads no such variable (did you mean {nearest}?)")


def test_a_users_own_variable_is_left_alone_once_named():
    """A shell variable that only looks like a typo (NODES, one letter from NNODES) is refused with the way out, and
    the way out works for the names it lists only."""
    (error,) = unknown_variables({"NODES": "4"})
    assert "export RECIPE_ALLOW_VARIABLES=NODES" in error
    assert unknown_variables({"NODES": "4", "RECIPE_ALLOW_VARIABLES": "NODES, CKPT_DIR"}) == []
    (error,) = unknown_variables({"NODES": "4", "NNODE": "2", "RECIPE_ALLOW_VARIABLES": "NODES"})
    assert error.startswith("NNODE is set")


def test_other_projects_and_the_shells_variables_are_left_alone():
    """vLLM's, Ray's, verl's, wandb's, CUDA's and torch's own variables (some a letter or two from a declared one),
    the recipe's non-knob variables and a shell's usual ones are never refused."""
    env = {n: "1" for n in ("VLLM_USE_V1", "VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL", "RAY_worker_niceness",
                            "RAY_DEDUP_LOGS", "VERL_FILE_LOGGER_PATH", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_NAME",
                            "CUDA_DEVICE_MAX_COPY_CONNECTIONS", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "MASTER_ADDR",
                            "NODE_RANK", "LOCAL_RANK", "HF_HOME", "PYTHONHOME", "RECIPE_FIXTURE_CACHE",
                            "SANDBOX_WALL_TIMEOUT_S", "HOME", "PATH", "USER", "SHELL", "TERM", "LANG", "PWD",
                            "TMPDIR", "HOSTNAME", "EDITOR", "MAX_JOBS", "MODEL_DIR", "DATA_DIR", "CI")}
    assert unknown_variables({**env, **os.environ}) == []


def test_every_variable_the_recipe_reads_is_declared():
    """Each ``environ``/``env.get`` read of a literal name in recipe/ is a declared variable or another project's."""
    read = set()
    for path in (REPO / "recipe").rglob("*.py"):
        read |= set(re.findall(r"(?:environ|env)(?:\.get\(|\[)\s*[\"']([A-Z][A-Z0-9_]+)[\"']", path.read_text()))
    system = {"CI", "HOME", "TMPDIR", "PATH", "USER"}
    undeclared = {n for n in read - declared_names() if not n.startswith(FOREIGN_PREFIXES)} - system
    assert not undeclared, f"declare them in recipe/preflight/knobs.py: {sorted(undeclared)}"


def test_three_mistakes_give_three_problems_in_one_report(env_30b):
    """A misspelled name, a bad value (its default stands in, so the checks go on) and a reward function the file
    lacks (found only on the composed config): before, the bad value stopped the preflight with one problem."""
    report = run_preflight([], {**env_30b, "SAVE_CKPT_ENABLED": "1", "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "abc",
                                "REWARD_FUNCTION_NAME": "no_such_function"})
    assert len(report.errors) == 3, report.errors
    assert report.errors[0].startswith("SAVE_CKPT_ENABLED is set")
    assert report.errors[1].startswith("VLLM_ROLLOUT_EARLY_STOP_FACTOR='abc' must be a number")
    assert "no_such_function" in report.errors[2]
    assert "preflight: 3 problem(s); nothing was launched" in format_report(report)


def test_a_variable_without_effect_is_named(env_30b):
    report = run_preflight([], {**env_30b, "TAIL_CUT_FRACTION": "0.9", "TRAINER_SAVE_FREQ": "5"})
    assert report.ok, report.errors
    assert "TAIL_CUT_FRACTION is set but has no effect in this run: TAIL_CUT_ENABLE is off" in report.notes
    assert "TRAINER_SAVE_FREQ is set but has no effect in this run: SAVE_CKPT_ENABLE is off: nothing is saved" \
        in report.notes
    on = run_preflight([], {**env_30b, "TAIL_CUT_ENABLE": "1", "TAIL_CUT_FRACTION": "0.9"})
    assert not any("TAIL_CUT_FRACTION" in n for n in on.notes), on.notes


def test_a_variable_that_replaces_a_presets_value_is_named_and_the_levers_table_lists_what_is_on(env_30b):
    """POLICY_PRESET=best-onpolicy-spec with the cap turned back on by the user: the note names the user's variable
    and the preset's value; the levers table shows the preset's tail cut, priority scheduling and group drafter."""
    report = run_preflight([], {**env_30b, "POLICY_PRESET": "best-onpolicy-spec",
                                "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1"})
    assert ("VLLM_ROLLOUT_EARLY_STOP_ENABLE='1' (yours) replaces POLICY_PRESET=best-onpolicy-spec's "
            "VLLM_ROLLOUT_EARLY_STOP_ENABLE='0'") in report.notes
    text = format_report(report)
    levers = text.split("preflight: levers on\n", 1)[1].split("preflight: ", 1)[0].splitlines()
    names = [line.split("  ")[1].strip() for line in levers]
    assert names[:6] == ["sampler", "cap", "tail cut", "scheduling", "drafter", "router replay"], levers
    assert "held at 0.008 extra truncation" in levers[2] and "priority" in levers[3] and "group" in levers[4]
    assert levers[-1].split() == ["(off)", "over-sample,", "checkpoints"]


def test_print_env_applies_the_presets():
    """``--print-env`` printed ROLLOUT_SPECULATIVE=off under POLICY_PRESET=best-onpolicy-spec: what the run would
    not use."""
    env = {k: v for k, v in os.environ.items() if k not in ("ROLLOUT_SPECULATIVE", "PRESET")}
    r = subprocess.run([sys.executable, "-m", "recipe.preflight", "--print-env", "ROLLOUT_SPECULATIVE",
                        "TAIL_CUT_ENABLE"], env={**env, "POLICY_PRESET": "best-onpolicy-spec"}, cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ROLLOUT_SPECULATIVE=group", "TAIL_CUT_ENABLE=True"]


def test_the_gpu_stack_not_checked_off_a_gpu_node_is_said(env_30b):
    report = run_preflight([], {**env_30b, "RECIPE_STACK_TARGET": "cpu"})
    assert any("GPU stack" in n and "was NOT checked" in n for n in report.notes), report.notes


def test_the_scripts_real_run_inputs_are_the_declared_ones():
    """train_grpo.sh refuses these without MODEL_PATH before choosing a preset (before Python): its list is the
    knobs' one."""
    script = (REPO / "scripts" / "train_grpo.sh").read_text()
    listed = re.search(r"for name in ([A-Z_ ]+); do", script).group(1).split()
    assert tuple(listed) == REAL_RUN_INPUTS
