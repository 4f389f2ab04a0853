"""MULTI_TURN=1 in the preflight: the keys it sets, the combinations it accepts, and the tool config's own checks.

Composed in-process with the real verl 0.9.1 + recipe YAML (``run_preflight``, what scripts/train_grpo.sh calls).
"""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight

ARR = "actor_rollout_ref"
REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "recipe" / "tools" / "configs"


def test_multi_turn_sets_verls_keys_and_the_recipes_tool_loop(env_30b):
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1"})
    assert report.ok, report.errors
    mt = OmegaConf.to_container(report.config, resolve=True)[ARR]["rollout"]
    assert mt["multi_turn"]["enable"] is True
    assert mt["multi_turn"]["tool_config_path"] == str(TOOLS / "calculator.yaml")
    assert mt["multi_turn"]["format"] == "hermes"
    assert mt["multi_turn"]["max_tool_response_length"] == 2048
    assert mt["agent"]["default_agent_loop"] == "length_capped_tool_agent"
    assert report.values["EXPERIMENT_NAME"].endswith("-tools")


def test_single_turn_stays_the_default(env_30b):
    report = run_preflight([], env_30b)
    rollout = OmegaConf.to_container(report.config, resolve=True)[ARR]["rollout"]
    assert rollout["multi_turn"]["enable"] is False
    assert rollout["agent"]["default_agent_loop"] == "length_capped_single_turn"


def test_partial_rollout_passes_on_multi_turn(env_30b):
    """CappedToolAgentLoop resumes a cut trajectory from its turn-boundary snapshot (tests/adapter)."""
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1", "OVER_SAMPLE_ENABLE": "1",
                                "OVER_SAMPLE_REQUEUE": "continue"})
    assert report.ok, report.errors
    over_sample = OmegaConf.to_container(report.config, resolve=True)["recipe"]["over_sample"]
    assert over_sample["enable"] and over_sample["requeue"] == "continue"


def test_a_missing_tool_config_is_named(env_30b, tmp_path):
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1", "TOOL_CONFIG": str(tmp_path / "nope.yaml")})
    assert any(e.startswith("TOOL_CONFIG=") and "does not exist" in e for e in report.errors), report.errors


def test_a_tool_config_verl_cannot_load_is_named(env_30b, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n  - class_name: recipe.tools.verl_tools.NoSuchTool\n    config: {type: native}\n")
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1", "TOOL_CONFIG": str(bad)})
    assert any("does not load with verl's tool loader" in e for e in report.errors), report.errors


def test_a_sandbox_that_cannot_run_is_named_before_the_launch(env_30b, monkeypatch):
    """The Python tool on SandboxFusion without a server URL: the sandbox's self-check names the fix. (The tool
    config reads SANDBOX_BACKEND from the process environment, as verl's workers will.)"""
    monkeypatch.setenv("SANDBOX_BACKEND", "sandbox_fusion")
    monkeypatch.delenv("SANDBOX_FUSION_URL", raising=False)
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1", "TOOL_CONFIG": str(TOOLS / "python_tool.yaml")})
    assert any("'code_interpreter' cannot run a program in its sandbox" in e and "SANDBOX_FUSION_URL" in e
               for e in report.errors), report.errors


def test_the_python_tool_passes_where_bubblewrap_runs(env_30b):
    from recipe.tools.sandbox import sandbox_self_check

    if (err := sandbox_self_check("bubblewrap")) is not None:
        pytest.skip(f"bubblewrap sandbox unavailable here: {err}")
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1", "TOOL_CONFIG": str(TOOLS / "python_tool.yaml")})
    assert report.ok, report.errors


@pytest.mark.parametrize("extra, model, data, reward, response", [
    ({}, "qwen3moe-sft-", "countdown-train", "math_reward.py", 160),
    ({"CPU_MODEL": "random"}, "qwen3moe-v", "train-n48", "smoke_reward.py", 32),
    ({"MULTI_TURN": "1"}, "qwen3moe-sft-", "calculator-train", "tool_use_reward.py", 96),
])
def test_the_cpu_presets_three_flavours(tmp_path, extra, model, data, reward, response):
    report = run_preflight([], {"PRESET": "cpu", "CKPT_ROOT": str(tmp_path), **extra})
    assert report.ok, report.errors
    v = report.values
    assert Path(v["MODEL_PATH"]).name.startswith(model)
    assert Path(v["TRAIN_FILE"][0]).name.startswith(data) and Path(v["REWARD_FUNCTION_PATH"]).name == reward
    assert v["MAX_RESPONSE_LENGTH"] == response
