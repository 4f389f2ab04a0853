"""Every bad input the preflight catches: the message names the variable and the fix, with no traceback.

Environment values are parsed before Hydra composition (a bad value is reported under its variable name, not as
a grammar error); layout, model, checkpoint, data and batch problems are checked on the composed config; all
problems of a phase are reported together.
"""
import pandas as pd
import pytest

from recipe.preflight import format_report, run_preflight
from harness.cpu_runs import CPU_RANDOM


def error_with(report, *parts):
    """The one error message containing all ``parts`` (fails with every message shown)."""
    assert not report.ok
    hits = [e for e in report.errors if all(p in e for p in parts)]
    assert hits, f"no error with {parts}:\n" + "\n".join(report.errors)
    return hits[0]


# ---- environment values: parsed before composition ----------------------------------------------------------

@pytest.mark.parametrize("var,value,parts", [
    ("VLLM_ROLLOUT_EARLY_STOP_FACTOR", "abc", ["must be a number", "export VLLM_ROLLOUT_EARLY_STOP_FACTOR=2.0"]),
    ("VLLM_EAGER_BASELINE_NO_RESAMPLE", "yes", ["must be 0 or 1", "export VLLM_EAGER_BASELINE_NO_RESAMPLE=0"]),
    ("SAVE_CKPT_ENABLE", "2", ["must be 0 or 1"]),
    ("ACTOR_TP", "two", ["must be an integer", "export ACTOR_TP=2"]),
    ("NNODES", "0", ["must be >= 1", "export NNODES=2"]),
    ("VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS", "1e4", ["must be an integer"]),
    ("VLLM_ROLLOUT_EARLY_STOP_MODE", "fast", ["must be one of 'seed', 'calibrated'"]),
    ("SAMPLER_STATISTIC", "p200", ["export SAMPLER_STATISTIC=mean"]),
    ("OVER_SAMPLE_RATIO", "nan", ["finite number"]),
    ("WANDB_MODE", "loud", ["must be one of 'online', 'offline', 'disabled'"]),
    ("EXPERIMENT_NAME", "a/b", ["plain directory name"]),
    ("GEN_BATCH_SIZE", "12", ["TRAIN_BATCH_SIZE=32 is not a multiple of GEN_BATCH_SIZE=12", "unset GEN_BATCH_SIZE"]),
])
def test_bad_environment_value_is_named_before_composition(env_30b, var, value, parts):
    report = run_preflight([], {**env_30b, var: value})
    error_with(report, f"{var}=", *parts)
    # named by its variable, once; the checks go on with the default in its place, never as a Hydra grammar error
    assert sum(var in e for e in report.errors) == 1 and not any(
        "do not compose" in e for e in report.errors), report.errors


@pytest.mark.parametrize("var", ["MODEL_PATH", "DISTCP_PATH", "TRAIN_FILE", "TEST_FILE"])
def test_missing_input_says_what_to_export(env_30b, var):
    env = {k: v for k, v in env_30b.items() if k != var}
    error_with(run_preflight([], env), f"{var} is not set", f"export {var}=")


def test_all_environment_problems_are_reported_at_once(env_30b):
    report = run_preflight([], {**env_30b, "ACTOR_EP": "x", "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "abc",
                                "TRAIN_FILE": ""})
    assert len(report.errors) == 3, report.errors
    text = format_report(report)
    assert "preflight: 3 problem(s); nothing was launched" in text and "Traceback" not in text


def test_baseline_with_over_sample_is_contradictory(env_30b):
    report = run_preflight([], {**env_30b, "VLLM_EAGER_BASELINE_NO_RESAMPLE": "1", "OVER_SAMPLE_ENABLE": "1"})
    error_with(report, "VLLM_EAGER_BASELINE_NO_RESAMPLE=1", "OVER_SAMPLE_ENABLE=1", "unset OVER_SAMPLE_ENABLE")


# ---- Megatron layout --------------------------------------------------------------------------------------------

def test_gpu_count_not_divisible_by_tp_pp_cp(env_30b):
    report = run_preflight([], {**env_30b, "NNODES": "1", "GPUS_PER_NODE": "6"})
    error_with(report, "ACTOR_TP=2 x ACTOR_PP=4 x ACTOR_CP=1 = 8 does not divide", "GPUS_PER_NODE=6",
               "world % (TP x PP x CP) == 0")


def test_expert_grid_must_divide_world_over_pp(env_30b):
    report = run_preflight([], {**env_30b, "ACTOR_EP": "8"})
    error_with(report, "ACTOR_EP=8 x ACTOR_ETP=1 x ACTOR_PP=4 = 32 does not divide the 16 GPUs",
               "EP x ETP to divide world / PP = 4", "ACTOR_EP=4")


def test_expert_tensor_parallel_that_fits_no_ep(env_30b):
    error_with(run_preflight([], {**env_30b, "ACTOR_ETP": "3"}), "ACTOR_EP=4 x ACTOR_ETP=3 x ACTOR_PP=4 = 48",
               "lower ACTOR_ETP or ACTOR_PP")


def test_ep_must_divide_num_experts(env_tiny):
    env = {**env_tiny, "GPUS_PER_NODE": "3", "ACTOR_TP": "1", "ACTOR_PP": "1", "ACTOR_EP": "3", "ROLLOUT_TP": "1",
           "ACTOR_PPO_MINI_BATCH_SIZE": "3", "TRAIN_BATCH_SIZE": "6"}
    error_with(run_preflight([], env), "ACTOR_EP=3 does not divide num_experts=8", "choose one of [1, 2]")


def test_tp_must_divide_the_kv_heads(env_30b):
    report = run_preflight([], {**env_30b, "ACTOR_TP": "8", "ACTOR_PP": "2", "ACTOR_EP": "8",
                                "ACTOR_PP_FIRST_LAYERS": "0", "ACTOR_PP_LAST_LAYERS": "0"})
    error_with(report, "ACTOR_TP=8 must divide", "num_key_value_heads=4", "divisor of 4")


def test_sequence_parallel_required_with_tp_and_ep(env_30b):
    error_with(run_preflight([], {**env_30b, "ACTOR_SEQUENCE_PARALLEL": "0"}),
               "ACTOR_SEQUENCE_PARALLEL=0", "export ACTOR_SEQUENCE_PARALLEL=1")


def test_pipeline_split_must_sum_to_the_layers(env_30b):
    report = run_preflight([], {**env_30b, "ACTOR_PP_FIRST_LAYERS": "12"})
    error_with(report, "ACTOR_PP_FIRST_LAYERS=12 + ACTOR_PP_LAST_LAYERS=11 leave 25 of num_hidden_layers=48 for 2 "
               "middle stage(s)", "e.g. ACTOR_PP_FIRST_LAYERS=11 ACTOR_PP_LAST_LAYERS=11")


def test_uneven_defaults_with_two_stages_suggest_an_even_split(env_30b):
    report = run_preflight([], {**env_30b, "ACTOR_PP": "2"})
    error_with(report, "= 22 != num_hidden_layers=48 with ACTOR_PP=2", "ACTOR_PP_FIRST_LAYERS=0 ACTOR_PP_LAST_LAYERS=0")


def test_uneven_stages_need_pipeline_parallelism(env_tiny):
    report = run_preflight([], {**env_tiny, "ACTOR_PP": "1", "ACTOR_PP_FIRST_LAYERS": "1"})
    error_with(report, "ACTOR_PP_FIRST_LAYERS=1", "ACTOR_PP=1", "export ACTOR_PP_FIRST_LAYERS=0 ACTOR_PP_LAST_LAYERS=0")


# ---- model, checkpoint, data, reward -----------------------------------------------------------------------

def test_model_path_without_config_json(env_30b, tmp_path):
    error_with(run_preflight([], {**env_30b, "MODEL_PATH": str(tmp_path)}), f"MODEL_PATH={tmp_path}",
               "has no config.json", "Hugging Face model directory")


def test_missing_dist_checkpoint_prints_the_convert_command(env_30b, tmp_path):
    missing = tmp_path / "nope"
    msg = error_with(run_preflight([], {**env_30b, "DISTCP_PATH": str(missing)}), f"DISTCP_PATH={missing}",
                     "does not exist", "scripts/convert_hf_to_distcp.sh")
    assert f"MODEL_PATH={env_30b['MODEL_PATH']} DISTCP_PATH={missing} bash " in msg
    assert "actor_rollout_ref.actor.megatron" in msg and "actor_rollout_ref.ref.megatron" in msg  # reported once


def test_directory_that_is_not_a_dist_checkpoint(env_30b, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    error_with(run_preflight([], {**env_30b, "DISTCP_PATH": str(tmp_path)}), "DISTCP_PATH=", "no metadata.json",
               "interrupted conversion")


def test_data_file_missing(env_30b, tmp_path):
    error_with(run_preflight([], {**env_30b, "TEST_FILE": str(tmp_path / "test.parquet")}), "TEST_FILE:",
               "does not exist", "scripts/prepare_data.py")


def test_data_file_without_verl_columns(env_30b, tmp_path):
    bad = tmp_path / "raw.parquet"
    pd.DataFrame({"question": ["1+1?"], "answer": ["2"]}).to_parquet(bad)
    error_with(run_preflight([], {**env_30b, "TRAIN_FILE": str(bad)}), "TRAIN_FILE:", "lacks column(s)",
               "'prompt'", "convert it with scripts/prepare_data.py")


def test_plain_text_prompt_is_accepted_and_a_bad_type_named(env_30b, tmp_path):
    """A plain-text prompt is one user message (recipe/user_data.py); a prompt of another type is named with its key."""
    plain = tmp_path / "plain.parquet"
    pd.DataFrame({"prompt": ["1+1?"], "data_source": ["x"], "reward_model": [{"ground_truth": "2"}]}).to_parquet(plain)
    assert not [e for e in run_preflight([], {**env_30b, "TEST_FILE": str(plain)}).errors if "TEST_FILE" in e]
    bad = tmp_path / "ints.parquet"
    pd.DataFrame({"prompt": [1], "reward_model": [{"ground_truth": "2"}]}).to_parquet(bad)
    error_with(run_preflight([], {**env_30b, "TEST_FILE": str(bad)}), "TEST_FILE:", "(PROMPT_KEY) is int64")


def test_train_file_smaller_than_one_batch(env_30b):
    error_with(run_preflight([], {**env_30b, "TRAIN_BATCH_SIZE": "128", "ACTOR_PPO_MINI_BATCH_SIZE": "8"}),
               "TRAIN_FILE holds 96 rows", "TRAIN_BATCH_SIZE=128")


def test_reward_function_must_exist_in_the_file(env_30b):
    error_with(run_preflight([], {**env_30b, "REWARD_FUNCTION_NAME": "score_it"}), "REWARD_FUNCTION_NAME=score_it",
               "REWARD_FUNCTION_PATH=")


def test_context_longer_than_the_model(env_tiny):
    error_with(run_preflight([], {**env_tiny, "MAX_RESPONSE_LENGTH": "8192"}), "MAX_PROMPT_LENGTH + "
               "MAX_RESPONSE_LENGTH = 9216", "max_position_embeddings=4096")


# ---- rollout and batches ------------------------------------------------------------------------------------

def test_rollout_ep_must_equal_tp_times_dp(env_30b):
    error_with(run_preflight([], {**env_30b, "ROLLOUT_EP": "2"}), "ROLLOUT_EP=2 must equal ROLLOUT_TP=4 x "
               "ROLLOUT_DP=1", "export ROLLOUT_EP=4 or ROLLOUT_EP=1")


def test_rollout_replicas_must_tile_the_gpus(env_30b):
    report = run_preflight([], {**env_30b, "ROLLOUT_TP": "3"})
    error_with(report, "ROLLOUT_TP=3", "does not divide the 16 GPUs")
    error_with(report, "ROLLOUT_TP=3 must divide num_attention_heads=32")


def test_vllm_needs_a_token_per_running_sequence(env_30b):
    error_with(run_preflight([], {**env_30b, "ROLLOUT_MAX_NUM_BATCHED_TOKENS": "100"}),
               "ROLLOUT_MAX_NUM_BATCHED_TOKENS=100 < ROLLOUT_MAX_NUM_SEQS=256")


def test_mini_batch_must_divide_the_train_batch(env_30b):
    error_with(run_preflight([], {**env_30b, "ACTOR_PPO_MINI_BATCH_SIZE": "12"}),
               "TRAIN_BATCH_SIZE=32 is not a multiple of ACTOR_PPO_MINI_BATCH_SIZE=12")


def test_mini_batch_responses_must_split_over_data_parallel_ranks(env_tiny):
    env = {**env_tiny, "TRAIN_BATCH_SIZE": "4", "ACTOR_PPO_MINI_BATCH_SIZE": "1", "ROLLOUT_N": "1"}
    error_with(run_preflight([], env), "ACTOR_PPO_MINI_BATCH_SIZE=1 x ROLLOUT_N=1 = 1", "2 data-parallel ranks")


def test_token_budget_must_hold_one_full_sequence(env_30b):
    error_with(run_preflight([], {**env_30b, "ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU": "4096"}),
               "ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU=4096", "17408", "set it to >= 17408")


def test_recipe_settings_errors_name_the_variable(env_30b):
    """recipe.settings rejects the value after composition, naming the key and its variable."""
    error_with(run_preflight([], {**env_30b, "SAMPLER_EMA_DECAY": "1.5"}), "SAMPLER_EMA_DECAY", "<= 0.999")


def test_tail_cut_contradictions_name_both_switches(env_30b):
    """The tail cut trains the stragglers truncated, the over-sampler re-queues them: not both. Its default level
    term reads the sampler's estimates, so the baseline arm (no sampler) must turn it off."""
    error_with(run_preflight([], {**env_30b, "TAIL_CUT_ENABLE": "1", "OVER_SAMPLE_ENABLE": "1"}),
               "TAIL_CUT_ENABLE", "OVER_SAMPLE_ENABLE", "choose one")
    error_with(run_preflight([], {**env_30b, "TAIL_CUT_ENABLE": "1", "BASELINE_NO_RESAMPLE": "1"}),
               "TAIL_CUT_LEVEL_EXPONENT", "set TAIL_CUT_LEVEL_EXPONENT=0")
    report = run_preflight([], {**env_30b, "TAIL_CUT_ENABLE": "1", "BASELINE_NO_RESAMPLE": "1",
                                "TAIL_CUT_LEVEL_EXPONENT": "0"})
    assert report.ok, report.errors
    assert report.config["recipe"]["tail_cut"] == {"enable": True, "fraction": 0.975, "level_exponent": 0.0,
                                                   "max_extra_truncation": 0.0}


def test_cpu_preset_keeps_seeded_requests_out_of_chunked_prefill(tmp_path):
    """vLLM CPU crashes on a chunked prefill of a seeded request (found by the e2e over-sample run): the CPU config
    prefills whole prompts, and turning chunked prefill back on with the preset's sampling seed is refused."""
    env = {**CPU_RANDOM, "CKPT_ROOT": str(tmp_path)}
    report = run_preflight([], env)
    assert report.ok, report.errors
    assert report.config["actor_rollout_ref"]["rollout"]["enable_chunked_prefill"] is False
    error_with(run_preflight(["actor_rollout_ref.rollout.enable_chunked_prefill=true"], env),
               "enable_chunked_prefill=True", "ROLLOUT_SAMPLING_SEED", "unset ROLLOUT_SAMPLING_SEED")
    report = run_preflight(["actor_rollout_ref.rollout.enable_chunked_prefill=true", "recipe.sampling_seed=null"], env)
    assert report.ok, report.errors


def test_a_cap_floor_above_the_response_length_is_a_note_not_an_error(env_tiny):
    report = run_preflight([], {**env_tiny, "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "4096"})
    assert report.ok, report.errors
    assert any("VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS=4096 >= MAX_RESPONSE_LENGTH=2048" in n for n in report.notes)


# ---- user overrides and several problems ------------------------------------------------------------------------

def test_bad_user_override_is_a_clean_error(env_30b):
    report = run_preflight(["trainer.no_such_key=1"], env_30b)
    msg = error_with(report, "the overrides do not compose", "no_such_key")
    assert "\n" not in msg


def test_override_that_breaks_the_layout_names_the_variable_too(env_30b):
    report = run_preflight(["actor_rollout_ref.actor.megatron.expert_model_parallel_size=16"], env_30b)
    error_with(report, "ACTOR_EP=16")


def test_all_config_problems_are_reported_at_once(env_30b, tmp_path):
    report = run_preflight([], {**env_30b, "ACTOR_EP": "8", "DISTCP_PATH": str(tmp_path / "missing"),
                                "ROLLOUT_EP": "2"})
    error_with(report, "ACTOR_EP=8")
    error_with(report, "DISTCP_PATH=")
    error_with(report, "ROLLOUT_EP=2")


# ---- python -m recipe.preflight --print-env -------------------------------------------------------------------

def _print_env(env: dict, *names: str):
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "PRESET", "GPUS_PER_NODE")}
    return subprocess.run([sys.executable, "-m", "recipe.preflight", "--print-env", *names], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_print_env_gives_computed_defaults_and_names_what_blocks_them():
    """A computed default (EXPERIMENT_NAME reads the arm, the cap, the preset...) prints like a static one; without
    the variables it is computed from, the error names them, with no traceback."""
    ok = _print_env({"PRESET": "cpu", "CPU_MODEL": "random", "BASELINE_NO_RESAMPLE": "1"}, "EXPERIMENT_NAME",
                    "GPUS_PER_NODE")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["EXPERIMENT_NAME=cpu-grpo-baseline", "GPUS_PER_NODE=1"]  # the preset's value
    blocked = _print_env({}, "EXPERIMENT_NAME")
    assert blocked.returncode == 2 and "Traceback" not in blocked.stderr
    assert "EXPERIMENT_NAME has no value" in blocked.stderr and "MODEL_PATH is not set" in blocked.stderr
    bad = _print_env({"GPUS_PER_NODE": "x"}, "GPUS_PER_NODE", "NOT_A_KNOB")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == ["preflight: ERROR: NOT_A_KNOB is not a preflight variable",
                                       "preflight: ERROR: GPUS_PER_NODE='x' must be an integer; e.g. export "
                                       "GPUS_PER_NODE=8 (sets trainer.n_gpus_per_node)"]
