"""Parsed values -> the Hydra overrides of one launch, and where that launch writes (:class:`RunPaths`)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from ..loggers import trainer_loggers
from ..rollout_spec import hydra_override as speculative_overrides
from ..settings import RecipeConfigError
from .knobs import ARR, MEG, RAY_ENV, REPO_ROOT, baseline_arm, is_cpu

GROUP_AFFINITY_ROUTER = REPO_ROOT / "configs" / "router" / "group_affinity.yaml"


def hydra_quote(value: str, var: str) -> str:
    """A Hydra quoted string (paths may hold spaces, commas, '=' ...)."""
    if "${" in value:
        raise RecipeConfigError(f"{var}={value!r}: '${{' would be read as an OmegaConf interpolation; rename the path")
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise RecipeConfigError(f"{var}={value!r} holds both quote characters; rename the path")


def _files(paths: list[str], var: str) -> str:
    return hydra_quote(paths[0], var) if len(paths) == 1 else "[" + ",".join(hydra_quote(p, var) for p in paths) + "]"


def _b(x: bool) -> str:
    return "True" if x else "False"


@dataclass(frozen=True)
class RunPaths:
    """Where one launch writes: a run directory per experiment, new log files per launch (verl truncates its
    file log on open, so a resume must never reuse a name)."""

    run_dir: str
    console_log: str
    metrics_log: str
    hydra_dir: str


def run_paths(v: dict, env: Mapping[str, str]) -> RunPaths:
    run_dir = os.path.join(v["CKPT_ROOT"], v["EXPERIMENT_NAME"])
    stamp = env.get("RECIPE_LAUNCH_STAMP") or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    logs = os.path.join(run_dir, "logs")
    base, n = stamp, 1
    while os.path.exists(os.path.join(logs, f"metrics.{stamp}.jsonl")):
        n += 1
        stamp = f"{base}-{n}"
    return RunPaths(run_dir, os.path.join(logs, f"console.{stamp}.log"),
                    os.path.join(logs, f"metrics.{stamp}.jsonl"), os.path.join(run_dir, "hydra", stamp))


def build_overrides(v: dict, paths: RunPaths) -> list[str]:
    """The Hydra overrides for parsed values ``v``; every key is set explicitly, even where the YAML agrees.

    The Megatron block applies to the GPU configs; the CPU preset's config (``length_aware_grpo_cpu``) has verl's
    FSDP engine, whose CPU settings live in that YAML, and gets the CPU platform's environment instead.
    """
    o = _inputs(v) + _algorithm_and_batches(v)
    o += _cpu_platform(v) if is_cpu(v) else _megatron(v)
    return o + _rollout(v) + _router_replay(v) + _multi_turn(v) + _arms(v) + _run(v, paths)


def _inputs(v: dict) -> list[str]:
    return [
        f"{ARR}.model.path={hydra_quote(v['MODEL_PATH'], 'MODEL_PATH')}",
        f"data.train_files={_files(v['TRAIN_FILE'], 'TRAIN_FILE')}",
        f"data.val_files={_files(v['TEST_FILE'], 'TEST_FILE')}",
        f"data.prompt_key={hydra_quote(v['PROMPT_KEY'], 'PROMPT_KEY')}",
        f"reward.custom_reward_function.path={hydra_quote(v['REWARD_FUNCTION_PATH'], 'REWARD_FUNCTION_PATH')}",
        f"reward.custom_reward_function.name={hydra_quote(v['REWARD_FUNCTION_NAME'], 'REWARD_FUNCTION_NAME')}",
        f"trainer.nnodes={v['NNODES']}",
        f"trainer.n_gpus_per_node={v['GPUS_PER_NODE']}",
    ] + ([  # the recipe's key (recipe/user_data.py: the answer column becomes reward_model.ground_truth)
        f"+data.answer_key={hydra_quote(v['ANSWER_KEY'], 'ANSWER_KEY')}",
    ] if v["ANSWER_KEY"] else [])


def _algorithm_and_batches(v: dict) -> list[str]:
    return [
        # GRPO: group-normalised advantages, no critic, KL as a loss term (not in the reward)
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"{ARR}.actor.use_kl_loss={_b(v['USE_KL_LOSS'])}",
        f"{ARR}.actor.kl_loss_coef={v['KL_LOSS_COEF']}",
        f"{ARR}.actor.kl_loss_type=low_var_kl",
        f"{ARR}.actor.entropy_coeff=0",
        f"{ARR}.actor.optim.lr={v['ACTOR_LR']}",
        f"{ARR}.actor.ppo_mini_batch_size={v['ACTOR_PPO_MINI_BATCH_SIZE']}",
        f"data.train_batch_size={v['TRAIN_BATCH_SIZE']}",
        f"data.gen_batch_size={v['GEN_BATCH_SIZE']}",
        f"data.max_prompt_length={v['MAX_PROMPT_LENGTH']}",
        f"data.max_response_length={v['MAX_RESPONSE_LENGTH']}",
        # worker processes would hold stale copies of the sampler (its estimates change every step)
        "data.dataloader_num_workers=0",
        f"{ARR}.rollout.n={v['ROLLOUT_N']}",
        # dynamic batch sizes: micro-batches packed up to a token budget
        f"{ARR}.actor.use_dynamic_bsz=True",
        f"{ARR}.actor.ppo_max_token_len_per_gpu={v['ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU']}",
        f"{ARR}.rollout.log_prob_use_dynamic_bsz=True",
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu={v['LOG_PROB_MAX_TOKEN_LEN_PER_GPU']}",
        f"{ARR}.ref.log_prob_use_dynamic_bsz=True",
        f"{ARR}.ref.log_prob_max_token_len_per_gpu={v['LOG_PROB_MAX_TOKEN_LEN_PER_GPU']}",
    ]


def _megatron(v: dict) -> list[str]:
    meg, ref = MEG, f"{ARR}.ref.megatron"
    otc = f"{meg}.override_transformer_config"
    distcp = v["DISTCP_PATH"] != "none"  # none: Megatron-Bridge loads MODEL_PATH (verl's own CI path)
    o = [f"{meg}.use_dist_checkpointing={_b(distcp)}", f"{ref}.use_dist_checkpointing={_b(distcp)}"]
    if distcp:  # verl's ref does not inherit these two
        o += [f"{meg}.dist_checkpointing_path={hydra_quote(v['DISTCP_PATH'], 'DISTCP_PATH')}",
              f"{ref}.dist_checkpointing_path={hydra_quote(v['DISTCP_PATH'], 'DISTCP_PATH')}"]
    o += [
        # the ref inherits the parallel sizes and override_transformer_config through oc.select
        f"{meg}.tensor_model_parallel_size={v['ACTOR_TP']}",
        f"{meg}.pipeline_model_parallel_size={v['ACTOR_PP']}",
        f"{meg}.context_parallel_size={v['ACTOR_CP']}",
        f"{meg}.expert_model_parallel_size={v['ACTOR_EP']}",
        f"{meg}.expert_tensor_parallel_size={v['ACTOR_ETP']}",
        f"{meg}.sequence_parallel={_b(v['ACTOR_SEQUENCE_PARALLEL'])}",
        f"{ref}.sequence_parallel={_b(v['ACTOR_SEQUENCE_PARALLEL'])}",
        f"{meg}.use_distributed_optimizer=True",
        f"{otc}.attention_backend={v['ACTOR_ATTENTION_BACKEND']}",
        f"{meg}.dist_ckpt_optim_fully_reshardable={_b(v['CKPT_OPTIM_FULLY_RESHARDABLE'])}",
        f"{meg}.param_offload={_b(v['ACTOR_PARAM_OFFLOAD'])}",
        f"{meg}.optimizer_offload={_b(v['ACTOR_OPTIMIZER_OFFLOAD'])}",
        f"{ref}.param_offload={_b(v['ACTOR_PARAM_OFFLOAD'])}",
    ]
    if v["ACTOR_PP_FIRST_LAYERS"]:
        o.append(f"+{otc}.num_layers_in_first_pipeline_stage={v['ACTOR_PP_FIRST_LAYERS']}")
    if v["ACTOR_PP_LAST_LAYERS"]:
        o.append(f"+{otc}.num_layers_in_last_pipeline_stage={v['ACTOR_PP_LAST_LAYERS']}")
    if v["ACTOR_RECOMPUTE"]:
        o += [f"{otc}.recompute_granularity=full", f"{otc}.recompute_method=uniform", f"{otc}.recompute_num_layers=1"]
    return o


def _cpu_platform(v: dict) -> list[str]:
    """The CPU platform's environment for every Ray actor (a local cluster inherits it too; this also covers a
    cluster started by hand)."""
    from ..cpu.preset import PLATFORM_ENV

    return [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={hydra_quote(val, k)}" for k, val in PLATFORM_ENV.items()]


def _rollout(v: dict) -> list[str]:
    # the seed's baseline arm runs vLLM eagerly (vLLM's enforce_eager: no CUDA graphs and no torch.compile); the CPU
    # config is always eager (no CUDA graphs on a CPU)
    eager = baseline_arm(v) == "eager" or is_cpu(v)
    return [
        f"{ARR}.rollout.name=vllm",
        f"{ARR}.rollout.tensor_model_parallel_size={v['ROLLOUT_TP']}",
        f"{ARR}.rollout.data_parallel_size={v['ROLLOUT_DP']}",
        f"{ARR}.rollout.expert_parallel_size={v['ROLLOUT_EP']}",
        f"{ARR}.rollout.gpu_memory_utilization={v['ROLLOUT_GPU_MEMORY_UTILIZATION']}",
        f"{ARR}.rollout.max_num_seqs={v['ROLLOUT_MAX_NUM_SEQS']}",
        f"{ARR}.rollout.max_num_batched_tokens={v['ROLLOUT_MAX_NUM_BATCHED_TOKENS']}",
        f"{ARR}.rollout.scheduling_policy={v['ROLLOUT_SCHEDULING_POLICY']}",
        f"{ARR}.rollout.enforce_eager={_b(eager)}",
    ] + speculative_overrides(v) + ([
        # recipe/adapter/router.py through verl's router extension point (the YAML names the class)
        f"{ARR}.rollout.router_config_path={hydra_quote(str(GROUP_AFFINITY_ROUTER), 'ROLLOUT_GROUP_AFFINITY')}",
    ] if v["ROLLOUT_GROUP_AFFINITY"] else []) + ([
        # the CPU config prefills whole prompts, so vLLM needs max_num_batched_tokens >= max_model_len, which
        # defaults to the model's max_position_embeddings (verl vllm_async_server.py _validate_configs)
        f"{ARR}.rollout.max_model_len={v['MAX_PROMPT_LENGTH'] + v['MAX_RESPONSE_LENGTH']}",
    ] if is_cpu(v) else [])


def _router_replay(v: dict) -> list[str]:
    """``ROUTER_REPLAY``: vLLM records the routes only for R3 (R2 records them in Megatron's own log-prob pass); the
    FSDP config of the CPU preset has no Megatron key. The rollout's log-probs are always returned: verl's mismatch
    metrics (``rollout_corr/k3_kl``, ``training/rollout_probs_diff_*``) compare them with the trainer's."""
    mode = v["ROUTER_REPLAY"]
    o = [f"{ARR}.rollout.enable_rollout_routing_replay={_b(mode == 'R3')}", f"{ARR}.rollout.calculate_log_probs=True"]
    if not is_cpu(v):
        o.append(f"{MEG}.router_replay.mode={'disabled' if mode == 'off' else mode}")
    return o


def _multi_turn(v: dict) -> list[str]:
    """verl's multi-turn settings; the recipe's tool loop (configs/agent_loops.yaml) for rows without agent_name."""
    mt = f"{ARR}.rollout.multi_turn"
    if not v["MULTI_TURN"]:
        return [f"{mt}.enable=False"]
    return [
        f"{mt}.enable=True",
        f"{mt}.tool_config_path={hydra_quote(v['TOOL_CONFIG'], 'TOOL_CONFIG')}",
        f"{mt}.format=hermes",  # Qwen3's <tool_call>{json}</tool_call>
        f"{mt}.max_tool_response_length={v['TOOL_MAX_RESPONSE_CHARS']}",
        f"{ARR}.rollout.agent.default_agent_loop=length_capped_tool_agent",
    ]


def _arms(v: dict) -> list[str]:
    """The comparison switches: a baseline arm turns sampler and cap off and reads the data in verl's seeded random
    order (nothing needs ``data.shuffle=False`` without the sampler); the resampler arm's sampler decides the order."""
    baseline = baseline_arm(v) is not None
    return [
        f"data.shuffle={_b(baseline)}",
        f"data.seed={v['DATA_SEED']}",
        "data.sampler.class_path=" + ("null" if baseline else "pkg://recipe.adapter.sampler"),
        "data.sampler.class_name=LengthAwareEpochSampler",
        f"data.sampler.seed={v['DATA_SEED']}",
        f"data.sampler.bucket_size={v['SAMPLER_BUCKET_SIZE']}",
        f"data.sampler.ema_decay={v['SAMPLER_EMA_DECAY']}",
        f"data.sampler.shuffle_batch_blocks={_b(v['SAMPLER_SHUFFLE_BATCH_BLOCKS'])}",
        f"data.sampler.statistic={hydra_quote(v['SAMPLER_STATISTIC'], 'SAMPLER_STATISTIC')}",
        f"data.sampler.order_by={v['SAMPLER_ORDER_BY']}",
        f"data.sampler.time_tokens_per_s={v['SAMPLER_TIME_TOKENS_PER_S']}",
        f"recipe.cap.enable={0 if baseline else int(v['VLLM_ROLLOUT_EARLY_STOP_ENABLE'])}",
        f"recipe.cap.mode={v['VLLM_ROLLOUT_EARLY_STOP_MODE']}",
        f"recipe.cap.budget.budget={v['VLLM_ROLLOUT_EARLY_STOP_BUDGET']}",
        "data.sampler.init_from=" + ("null" if v["SAMPLER_INIT_FROM"] == "none" else
                                     hydra_quote(v["SAMPLER_INIT_FROM"], "SAMPLER_INIT_FROM")),
        "data.sampler.prior_column=" + (hydra_quote(v["SAMPLER_PRIOR_COLUMN"], "SAMPLER_PRIOR_COLUMN")
                                        if v["SAMPLER_PRIOR_COLUMN"] else "null"),
        f"recipe.cap.factor={v['VLLM_ROLLOUT_EARLY_STOP_FACTOR']}",
        f"recipe.cap.min_tokens={v['VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS']}",
        f"recipe.over_sample.enable={int(v['OVER_SAMPLE_ENABLE'])}",
        f"recipe.over_sample.ratio={v['OVER_SAMPLE_RATIO']}",
        f"recipe.over_sample.requeue={v['OVER_SAMPLE_REQUEUE']}",
        f"recipe.over_sample.max_resumes={v['OVER_SAMPLE_MAX_RESUMES']}",
        f"recipe.tail_cut.enable={int(v['TAIL_CUT_ENABLE'])}",
        f"recipe.tail_cut.fraction={v['TAIL_CUT_FRACTION']}",
        f"recipe.tail_cut.level_exponent={v['TAIL_CUT_LEVEL_EXPONENT']}",
        f"recipe.tail_cut.max_extra_truncation={v['TAIL_CUT_MAX_EXTRA_TRUNCATION']}",
        f"recipe.record_tokens.enable={int(v['RECORD_TOKENS'])}",
        f"recipe.record_tokens.max_mb={v['RECORD_TOKENS_MAX_MB']}",
        f"recipe.draft_head.online={int(v['ROLLOUT_DRAFT_ONLINE'])}",
        f"recipe.draft_head.train_steps={v['ROLLOUT_DRAFT_TRAIN_STEPS']}",
        f"recipe.draft_head.capture_tokens={v['ROLLOUT_DRAFT_CAPTURE_TOKENS']}",
        f"recipe.draft_head.lr={v['ROLLOUT_DRAFT_LR']}",
        "recipe.sampling_seed=" + ("null" if v["ROLLOUT_SAMPLING_SEED"] is None else str(v["ROLLOUT_SAMPLING_SEED"])),
    ]


def actor_pythonpath(launcher_pythonpath: str) -> str:
    """The Ray actors' PYTHONPATH: this checkout first (``recipe``, ``reward``), then the launcher's entries, each
    once (``train_grpo.sh`` has already put the checkout in front of the launcher's own)."""
    entries = [str(REPO_ROOT), *launcher_pythonpath.split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(e for e in entries if e))


def _run(v: dict, paths: RunPaths) -> list[str]:
    """Run directory, checkpoints and logging; the Ray actors (TaskRunner, workers) may run on other nodes, where
    only what ``ray_kwargs.ray_init.runtime_env`` carries reaches them, so they get the logging environment, the
    import path and the Megatron launch setting explicitly."""
    env = RAY_ENV
    # verl 0.9.1 sets CUDA_DEVICE_MAX_CONNECTIONS=1 for Megatron only if the *launching* process sees a Hopper/Ampere
    # GPU (verl/trainer/constants_ppo.py:26 and :49 read the launcher's device capability, :123-124 add it to the
    # runtime env); a launcher without a GPU joining a cluster through RAY_ADDRESS would silently send nothing.
    # Quoted: Ray accepts only string values in env_vars.
    connections = hydra_quote(str(v["CUDA_DEVICE_MAX_CONNECTIONS"]), "CUDA_DEVICE_MAX_CONNECTIONS")
    megatron = [] if is_cpu(v) else [f"{env}.CUDA_DEVICE_MAX_CONNECTIONS={connections}"]
    # the group drafter's corpus bound, read by each engine (recipe/drafting/vllm_proposer.py corpus_bytes)
    corpus_gib = hydra_quote(f"{v['ROLLOUT_SPECULATIVE_CORPUS_GIB']:g}", "ROLLOUT_SPECULATIVE_CORPUS_GIB")
    corpus = [f"{env}.ROLLOUT_SPECULATIVE_CORPUS_GIB={corpus_gib}"] if v["ROLLOUT_SPECULATIVE"] == "group" else []
    return megatron + corpus + [
        f"{env}.PYTHONPATH={hydra_quote(actor_pythonpath(v['PYTHONPATH']), 'PYTHONPATH')}",
        f"trainer.project_name={hydra_quote(v['PROJECT_NAME'], 'PROJECT_NAME')}",
        f"trainer.experiment_name={hydra_quote(v['EXPERIMENT_NAME'], 'EXPERIMENT_NAME')}",
        f"trainer.default_local_dir={hydra_quote(paths.run_dir, 'CKPT_ROOT')}",
        f"trainer.total_epochs={v['TOTAL_EPOCHS']}",
        f"trainer.save_freq={v['TRAINER_SAVE_FREQ'] if v['SAVE_CKPT_ENABLE'] else -1}",
        f"trainer.resume_mode={'auto' if v['SAVE_CKPT_ENABLE'] else 'disable'}",
        f"trainer.max_actor_ckpt_to_keep={v['MAX_CKPT_TO_KEEP']}",
        f"trainer.test_freq={v['TRAINER_TEST_FREQ']}",
        f"trainer.val_before_train={_b(v['TRAINER_VAL_BEFORE_TRAIN'])}",
        "trainer.logger=[" + ",".join(trainer_loggers(v)) + "]",
        f"{env}.WANDB_MODE={v['WANDB_MODE']}",
        f"{env}.WANDB_DIR={hydra_quote(paths.run_dir, 'CKPT_ROOT')}",
        f"{env}.VERL_FILE_LOGGER_PATH={hydra_quote(paths.metrics_log, 'CKPT_ROOT')}",
    ]
