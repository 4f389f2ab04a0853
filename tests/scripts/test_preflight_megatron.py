"""The preflight's Megatron checks (recipe/preflight/megatron.py) and the Megatron overrides the recipe sets."""
import json
import shutil

import pytest

from recipe.preflight import run_preflight


def _model_with(tmp_path, src, **config):
    out = tmp_path / "model"
    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(config)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("norm_topk_prob", [False, None])
def test_unnormalised_qwen3_moe_routing_is_refused_by_name(tmp_path, env_30b, qwen3_30b_dir, norm_topk_prob):
    model = _model_with(tmp_path, qwen3_30b_dir, norm_topk_prob=norm_topk_prob)
    report = run_preflight([], {**env_30b, "MODEL_PATH": str(model)})
    hits = [e for e in report.errors if "norm_topk_prob" in e]
    assert len(hits) == 1, report.errors
    assert f"MODEL_PATH={model}" in hits[0] and "ALLOW_UNNORMALISED_ROUTING=1" in hits[0]
    assert ("norm_topk_prob=False" if norm_topk_prob is False else "norm_topk_prob=unset") in hits[0]
    accepted = run_preflight([], {**env_30b, "MODEL_PATH": str(model), "ALLOW_UNNORMALISED_ROUTING": "1"})
    assert not [e for e in accepted.errors if "norm_topk_prob" in e]


def test_the_real_config_and_the_fixture_pass_the_routing_check(env_30b, env_tiny):
    for env in (env_30b, env_tiny):
        assert not [e for e in run_preflight([], env).errors if "norm_topk_prob" in e]


def test_cpu_preset_is_not_refused_for_routing(tmp_path, tiny_artifacts):
    """FSDP trains the Hugging Face model: trainer and vLLM follow the same config."""
    from recipe.preflight.megatron import check_routing

    errors = []
    check_routing({"model_type": "qwen3_moe", "norm_topk_prob": False}, {"ALLOW_UNNORMALISED_ROUTING": True,
                                                                           "MODEL_PATH": "m"}, errors)
    assert errors == []
    check_routing({"model_type": "qwen2", "norm_topk_prob": False}, {"ALLOW_UNNORMALISED_ROUTING": False,
                                                                       "MODEL_PATH": "m"}, errors)
    assert errors == []


def test_attention_backend_defaults_to_auto_and_flash_needs_flash_attn(env_30b):
    report = run_preflight([], env_30b)
    assert "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto" in \
        report.env_overrides
    assert report.config["actor_rollout_ref"]["ref"]["megatron"]["override_transformer_config"][
        "attention_backend"] == "auto"
    flash = run_preflight([], {**env_30b, "ACTOR_ATTENTION_BACKEND": "flash", "RECIPE_STACK_TARGET": "gpu"})
    # this CPU stack has no flash-attn (nor the rest of the GPU stack: those are other errors)
    assert [e for e in flash.errors if e.startswith("ACTOR_ATTENTION_BACKEND=flash") and "ACTOR_ATTENTION_BACKEND=auto"
            in e]
    dry = run_preflight([], {**env_30b, "ACTOR_ATTENTION_BACKEND": "flash"})  # DRY_RUN target: no stack needed
    assert not [e for e in dry.errors if "ACTOR_ATTENTION_BACKEND" in e]


def test_optimizer_checkpoint_reshardability_is_a_knob(env_30b):
    key = "actor_rollout_ref.actor.megatron.dist_ckpt_optim_fully_reshardable"
    assert f"{key}=False" in run_preflight([], env_30b).env_overrides
    on = run_preflight([], {**env_30b, "CKPT_OPTIM_FULLY_RESHARDABLE": "1"})
    assert f"{key}=True" in on.env_overrides
    assert on.config["actor_rollout_ref"]["actor"]["megatron"]["dist_ckpt_optim_fully_reshardable"] is True


def _saved_checkpoint(run_dir, **layout):
    actor = run_dir / "global_step_7" / "actor"
    actor.mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("7")
    cfg = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4, "expert_model_parallel_size": 4,
           "expert_tensor_parallel_size": 1, "context_parallel_size": 1, "num_layers": 48, **layout}
    (actor / "transformer_config.json").write_text(json.dumps(cfg))


def test_resume_at_another_layout_is_refused_unless_the_optimizer_is_fully_reshardable(env_30b, tmp_path):
    env = {**env_30b, "CKPT_ROOT": str(tmp_path), "SAVE_CKPT_ENABLE": "1", "EXPERIMENT_NAME": "run"}
    _saved_checkpoint(tmp_path / "run", expert_model_parallel_size=8)
    report = run_preflight([], env)
    hits = [e for e in report.errors if "dp_reshardable" in e]
    assert len(hits) == 1 and "ACTOR_EP: saved 8, now 4" in hits[0] and "ACTOR_TP" not in hits[0].split("(")[1][:40]
    assert not [e for e in run_preflight([], {**env, "CKPT_OPTIM_FULLY_RESHARDABLE": "1"}).errors
                if "dp_reshardable" in e]
    assert not [e for e in run_preflight([], {**env, "ACTOR_EP": "8"}).errors if "dp_reshardable" in e]
    assert not [e for e in run_preflight([], {**env, "SAVE_CKPT_ENABLE": "0"}).errors if "dp_reshardable" in e]
