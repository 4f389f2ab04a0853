"""The switch combinations of scripts/train_grpo.sh, composed in-process with the real verl 0.9.1 + recipe YAML.

Each test asserts the resolved values the launch would run with. The bash path is covered end to end in
test_train_grpo_sh.py; here ``run_preflight`` (what the script calls) keeps each case well under a second.
"""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight

ARR = "actor_rollout_ref"
MEG = f"{ARR}.actor.megatron"
REPO = Path(__file__).resolve().parents[2]


def resolved(report):
    assert report.ok, report.errors
    return OmegaConf.to_container(report.config, resolve=True)


def sel(cfg, key):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def test_default_is_qwen3_30b_a3b_on_2x8_gpus(env_30b):
    report = run_preflight([], env_30b)
    c = resolved(report)
    expected = {
        "algorithm.adv_estimator": "grpo",
        "trainer.nnodes": 2, "trainer.n_gpus_per_node": 8,
        f"{ARR}.rollout.n": 16, "data.train_batch_size": 32, "data.gen_batch_size": 32,
        "data.max_prompt_length": 1024, "data.max_response_length": 16384, "trainer.total_epochs": 3,
        "data.shuffle": False, "data.dataloader_num_workers": 0,
        f"{MEG}.tensor_model_parallel_size": 2, f"{MEG}.pipeline_model_parallel_size": 4,
        f"{MEG}.expert_model_parallel_size": 4, f"{MEG}.expert_tensor_parallel_size": 1,
        f"{MEG}.context_parallel_size": 1, f"{MEG}.sequence_parallel": True, f"{MEG}.use_distributed_optimizer": True,
        f"{MEG}.override_transformer_config.num_layers_in_first_pipeline_stage": 11,
        f"{MEG}.override_transformer_config.num_layers_in_last_pipeline_stage": 11,
        f"{MEG}.override_transformer_config.recompute_granularity": "full",
        # the ref inherits the layout through verl's oc.select
        f"{ARR}.ref.megatron.pipeline_model_parallel_size": 4,
        f"{ARR}.ref.megatron.override_transformer_config.num_layers_in_first_pipeline_stage": 11,
        # ... but not the dist checkpoint: set explicitly for both
        f"{MEG}.use_dist_checkpointing": True, f"{MEG}.dist_checkpointing_path": env_30b["DISTCP_PATH"],
        f"{ARR}.ref.megatron.use_dist_checkpointing": True,
        f"{ARR}.ref.megatron.dist_checkpointing_path": env_30b["DISTCP_PATH"],
        f"{ARR}.actor.use_dynamic_bsz": True, f"{ARR}.actor.ppo_max_token_len_per_gpu": 17408,
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu": 34816, f"{ARR}.ref.log_prob_max_token_len_per_gpu": 34816,
        f"{ARR}.actor.use_kl_loss": True, f"{ARR}.actor.kl_loss_type": "low_var_kl",
        f"{ARR}.rollout.name": "vllm", f"{ARR}.rollout.tensor_model_parallel_size": 4,
        f"{ARR}.rollout.gpu_memory_utilization": 0.6, f"{ARR}.rollout.max_num_seqs": 256,
        f"{ARR}.rollout.max_num_batched_tokens": 17408, f"{ARR}.rollout.enforce_eager": False,
        "data.sampler.class_path": "pkg://recipe.adapter.sampler", "data.sampler.bucket_size": 1024.0,
        "data.sampler.ema_decay": 0.7, "data.sampler.shuffle_batch_blocks": True, "data.sampler.statistic": "mean",
        "recipe.cap.enable": 1, "recipe.cap.mode": "seed", "recipe.cap.factor": 2.0, "recipe.cap.min_tokens": 10000,
        "recipe.over_sample.enable": 0,
        "reward.custom_reward_function.name": "compute_score",
        "trainer.save_freq": -1, "trainer.resume_mode": "disable",
        "trainer.logger": ["console", "file", "wandb"],
        "trainer.experiment_name": "qwen3-30b-a3b-grpo-resampler",
    }
    assert {k: sel(c, k) for k in expected} == expected
    assert sel(c, "reward.custom_reward_function.path").endswith("reward/math_reward.py")
    run_dir = f"{env_30b['CKPT_ROOT']}/qwen3-30b-a3b-grpo-resampler"
    assert sel(c, "trainer.default_local_dir") == run_dir
    env_vars = sel(c, "ray_kwargs.ray_init.runtime_env.env_vars")
    assert env_vars == {"WANDB_MODE": "offline", "WANDB_DIR": run_dir,
                        "VERL_FILE_LOGGER_PATH": f"{run_dir}/logs/metrics.20260101T000000Z.jsonl",
                        "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONPATH": str(REPO)}  # test_multinode.py
    assert sel(c, "ray_kwargs.ray_init.num_cpus") is None  # RAY_ADDRESS clusters reject num_cpus
    assert dict(report.table)["pipeline layers"] == "11 | 13 | 13 | 11"


def test_baseline_switch_turns_off_sampler_and_cap_and_runs_vllm_eagerly(env_30b):
    c = resolved(run_preflight([], {**env_30b, "VLLM_EAGER_BASELINE_NO_RESAMPLE": "1"}))
    assert sel(c, f"{ARR}.rollout.enforce_eager") is True
    assert sel(c, "data.sampler.class_path") is None
    assert sel(c, "recipe.cap.enable") == 0
    assert sel(c, "trainer.experiment_name") == "qwen3-30b-a3b-grpo-baseline-eager"  # fair one: test_baseline_arms.py


def test_save_ckpt_enable_saves_under_the_run_dir_and_resumes(env_30b):
    env = {**env_30b, "SAVE_CKPT_ENABLE": "1", "TRAINER_SAVE_FREQ": "7", "MAX_CKPT_TO_KEEP": "3"}
    c = resolved(run_preflight([], env))
    assert (sel(c, "trainer.save_freq"), sel(c, "trainer.resume_mode"), sel(c, "trainer.max_actor_ckpt_to_keep")) \
        == (7, "auto", 3)
    assert sel(c, "trainer.default_local_dir") == f"{env_30b['CKPT_ROOT']}/qwen3-30b-a3b-grpo-resampler"


def test_cap_off_keeps_the_sampler(env_30b):
    c = resolved(run_preflight([], {**env_30b, "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "0"}))
    assert sel(c, "recipe.cap.enable") == 0
    assert sel(c, "data.sampler.class_path") == "pkg://recipe.adapter.sampler"
    assert sel(c, "trainer.experiment_name") == "qwen3-30b-a3b-grpo-resampler-nocap"


def test_calibrated_cap_and_sampler_knobs(env_30b):
    env = {**env_30b, "VLLM_ROLLOUT_EARLY_STOP_MODE": "calibrated", "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "1.5",
           "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "8000", "SAMPLER_BUCKET_SIZE": "512", "SAMPLER_EMA_DECAY": "0.5",
           "SAMPLER_SHUFFLE_BATCH_BLOCKS": "0", "SAMPLER_STATISTIC": "p90"}
    c = resolved(run_preflight([], env))
    assert (sel(c, "recipe.cap.mode"), sel(c, "recipe.cap.factor"), sel(c, "recipe.cap.min_tokens")) == \
        ("calibrated", 1.5, 8000)
    assert (sel(c, "data.sampler.bucket_size"), sel(c, "data.sampler.ema_decay"),
            sel(c, "data.sampler.shuffle_batch_blocks"), sel(c, "data.sampler.statistic")) == (512.0, 0.5, False, "p90")
    assert sel(c, "trainer.experiment_name") == "qwen3-30b-a3b-grpo-resampler-calcap"


def test_over_sample_on(env_30b):
    c = resolved(run_preflight([], {**env_30b, "OVER_SAMPLE_ENABLE": "1", "OVER_SAMPLE_RATIO": "0.5"}))
    assert (sel(c, "recipe.over_sample.enable"), sel(c, "recipe.over_sample.ratio")) == (1, 0.5)
    assert sel(c, "trainer.experiment_name") == "qwen3-30b-a3b-grpo-resampler-os"


def test_user_overrides_come_last_and_win(env_30b):
    report = run_preflight(["trainer.total_epochs=5",
                            f"{MEG}.override_transformer_config.num_layers_in_first_pipeline_stage=11"],
                           {**env_30b, "TOTAL_EPOCHS": "3"})
    c = resolved(report)
    assert sel(c, "trainer.total_epochs") == 5
    assert report.overrides[-2:] == ["trainer.total_epochs=5",
                                     f"{MEG}.override_transformer_config.num_layers_in_first_pipeline_stage=11"]
    assert "trainer.total_epochs=3" in report.env_overrides


def test_wandb_online_only_with_an_api_key_and_never_in_the_config(env_30b):
    report = run_preflight([], {**env_30b, "WANDB_API_KEY": "secret-key-123"})
    c = resolved(report)
    assert sel(c, "ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE") == "online"
    assert "secret-key-123" not in repr(c) + repr(report.overrides) + repr(report.values)
    c = resolved(run_preflight([], {**env_30b, "WANDB_API_KEY": "k", "WANDB_MODE": "offline"}))
    assert sel(c, "ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE") == "offline"


def test_tiny_model_layout_and_awkward_paths(env_tiny, tiny_artifacts, tmp_path):
    """The tiny model (4 layers, 8 experts) with matching parallel sizes; paths with spaces, '=' and brackets
    survive Hydra's grammar (they are quoted), and comma-separated test files become a list."""
    odd = tmp_path / "my data [v2]"
    odd.mkdir()
    train = odd / "train=1.parquet"
    train.write_bytes(tiny_artifacts.train_parquet.read_bytes())
    env = {**env_tiny, "TRAIN_FILE": str(train), "TEST_FILE": f"{tiny_artifacts.test_parquet},{train}"}
    report = run_preflight([], env)
    c = resolved(report)
    assert sel(c, "data.train_files") == str(train)
    assert sel(c, "data.val_files") == [str(tiny_artifacts.test_parquet), str(train)]
    assert dict(report.table)["pipeline layers"] == "2 | 2"


def test_smoke_preset_passes_on_cpu_without_its_dist_checkpoint(tmp_path):
    """PRESET=smoke converts the tiny model at launch (GPU); on this CPU machine the missing checkpoint is
    accepted, said so in a note, and flagged for the launch to create."""
    report = run_preflight([], {"PRESET": "smoke", "CKPT_ROOT": str(tmp_path)})
    c = resolved(report)
    assert report.smoke_convert
    assert any("smoke preset converts the tiny model" in n for n in report.notes)
    assert (sel(c, "trainer.nnodes"), sel(c, "trainer.n_gpus_per_node")) == (1, 1)
    assert [sel(c, f"{MEG}.{k}") for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                            "expert_model_parallel_size")] == [1, 1, 1]
    assert sel(c, "data.max_response_length") == 256
    assert sel(c, "recipe.cap.enable") == 1 and sel(c, "recipe.cap.min_tokens") == 64
    assert sel(c, "data.sampler.class_path") == "pkg://recipe.adapter.sampler"
    assert sel(c, "trainer.total_epochs") == 3
    assert sel(c, "trainer.experiment_name") == "smoke-grpo-resampler"
    assert sel(c, f"{MEG}.dist_checkpointing_path").endswith("-distcp")


def test_smoke_preset_yields_to_explicit_variables(tmp_path):
    report = run_preflight([], {"PRESET": "smoke", "CKPT_ROOT": str(tmp_path), "TOTAL_EPOCHS": "2"})
    assert sel(resolved(report), "trainer.total_epochs") == 2


def test_smoke_preset_with_another_model_needs_its_own_checkpoint(tmp_path, qwen3_30b_dir):
    report = run_preflight([], {"PRESET": "smoke", "CKPT_ROOT": str(tmp_path), "MODEL_PATH": str(qwen3_30b_dir)})
    assert any(e.startswith("DISTCP_PATH is not set") for e in report.errors), report.errors


def test_smoke_preset_still_rejects_an_incomplete_checkpoint(tmp_path):
    broken = tmp_path / "distcp"
    broken.mkdir()
    (broken / "common.pt").write_bytes(b"")
    report = run_preflight([], {"PRESET": "smoke", "CKPT_ROOT": str(tmp_path), "DISTCP_PATH": str(broken)})
    assert any("DISTCP_PATH" in e and "metadata.json" in e for e in report.errors), report.errors


@pytest.mark.parametrize("existing", [0, 2])
def test_each_launch_gets_new_log_files(env_30b, tmp_path, existing):
    """verl opens its file log with mode "wb": a second launch (a resume) must never reuse a name."""
    logs = tmp_path / "qwen3-30b-a3b-grpo-resampler" / "logs"
    logs.mkdir(parents=True)
    for name in ["metrics.20260101T000000Z.jsonl", "metrics.20260101T000000Z-2.jsonl"][:existing]:
        (logs / name).write_text("{}\n")
    report = run_preflight([], {**env_30b, "CKPT_ROOT": str(tmp_path)})
    assert report.ok, report.errors
    suffix = "" if existing == 0 else "-3"
    assert report.paths.metrics_log == str(logs / f"metrics.20260101T000000Z{suffix}.jsonl")
    assert report.paths.console_log == str(logs / f"console.20260101T000000Z{suffix}.log")
