"""MULTI_TURN=1 in the preflight: the keys it sets, the combinations it accepts, and the tool config's own checks.

Composed in-process with the real verl 0.9.1 + recipe YAML (``run_preflight``, what scripts/train_grpo.sh calls).
"""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight

ARR = "actor_rollout_ref"
GIB = 1024**3
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


def require_bubblewrap():
    """Skip only where bwrap is not installed and nothing promises it (CI=true, RECIPE_REQUIRE_SANDBOX=1)."""
    import shutil

    from recipe.tools.sandbox import sandbox_required, sandbox_self_check

    if shutil.which("bwrap") is None and not sandbox_required():
        pytest.skip("bubblewrap is not installed here")
    assert sandbox_self_check("bubblewrap") is None


def test_the_python_tool_passes_where_bubblewrap_runs(env_30b, monkeypatch):
    """On a node with 1 TiB (a GPU node): 4 workers per node x 8 sandboxes x 1 GiB fits its quarter."""
    require_bubblewrap()
    monkeypatch.setattr("recipe.preflight.tools.node_memory_bytes", lambda: 1024 * GIB)
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1", "TOOL_CONFIG": str(TOOLS / "python_tool.yaml")})
    assert report.ok, report.errors


def test_sandboxes_that_could_take_too_much_of_a_node_are_named(env_30b, monkeypatch):
    """8 workers over 2 nodes x max_concurrency 8 x 1 GiB = 32 GiB per node, over a quarter of a 64 GiB node."""
    require_bubblewrap()
    monkeypatch.setattr("recipe.preflight.tools.node_memory_bytes", lambda: 64 * GIB)
    report = run_preflight([], {**env_30b, "MULTI_TURN": "1", "TOOL_CONFIG": str(TOOLS / "python_tool.yaml")})
    problems = [e for e in report.errors if e.startswith("sandboxes may hold up to 32.0 GiB")]
    assert len(problems) == 1, report.errors
    for knob in ("actor_rollout_ref.rollout.agent.num_workers=8", "trainer.nnodes=2", "max_concurrency 8",
                 "memory_bytes 1 GiB", "64.0 GiB", "25%", "lower max_concurrency or limits.memory_bytes"):
        assert knob in problems[0], problems[0]


def test_the_sandbox_memory_bound_is_stated(monkeypatch):
    """Within the share, the bound and how it adds up is a note; per-process limits multiply by max_processes and
    add what lives outside the address spaces (socket buffers, the tmpfs)."""
    from recipe.preflight.tools import check_sandbox_memory, socket_buffer_bytes
    from recipe.tools.sandbox import make_backend

    class Tool:
        name, max_concurrency = "code_interpreter", 2
        backend = make_backend("bubblewrap", {"limits": {"memory_bytes": GIB // 2, "max_processes": 4}}, environ={})

    cfg = OmegaConf.create({ARR: {"rollout": {"agent": {"num_workers": 4}}}, "trainer": {"nnodes": 1}})
    errors, notes = [], []
    monkeypatch.setattr(Tool.backend, "limits_mode", lambda: ("cgroup", None))
    check_sandbox_memory(cfg, [Tool()], "t.yaml", errors, notes, 64 * GIB)
    assert errors == [] and len(notes) == 1 and notes[0].startswith("sandboxes may hold up to 4.0 GiB"), notes
    monkeypatch.setattr(Tool.backend, "limits_mode", lambda: (None, None))  # per-process limits accepted
    # per process: what each address space holds, what 256 sockets may buffer beside it, and the two tmpfs
    each = 4 * (GIB // 2 + 256 * socket_buffer_bytes()) + 2 * 64 * 2**20
    check_sandbox_memory(cfg, [Tool()], "t.yaml", errors, notes, 4 * 8 * each)
    assert errors == [] and notes[1].startswith(f"sandboxes may hold up to {8 * each / GIB:.1f} GiB"), notes
    assert "max_processes 4" in notes[1] and "socket buffer" in notes[1] and "2 x scratch_bytes" in notes[1]
    check_sandbox_memory(cfg, [Tool()], "t.yaml", errors, notes, 4 * 8 * each - GIB)
    assert len(errors) == 1 and "more than the 25%" in errors[0]


@pytest.mark.trained_model
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
