"""The recipe config (configs/length_aware_grpo.yaml) composed for the tiny local artifacts, and the recipe's agent
loops built from it as verl builds them: what route recording and the engine tests run the recipe's paths with."""
from __future__ import annotations

TRAIN_BATCH = 8
ROLLOUT_N = 2
RESPONSE_LENGTH = 64


def compose_recipe(artifacts, overrides=()):
    """Compose and resolve the recipe config on the tiny model/data: 1 GPU worth of parallelism, small batches,
    response_length 64 and a cap floor of 16 tokens so caps can bite. ``overrides`` come last and win."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recipe.main import CONFIGS_DIR

    with initialize_config_dir(config_dir=CONFIGS_DIR, version_base=None):
        cfg = compose("length_aware_grpo", overrides=[
            f"actor_rollout_ref.model.path={artifacts.model_dir}",
            f"data.train_files={artifacts.train_parquet}",
            f"data.val_files={artifacts.test_parquet}",
            "data.max_prompt_length=256",
            f"data.max_response_length={RESPONSE_LENGTH}",
            f"data.train_batch_size={TRAIN_BATCH}",
            f"data.gen_batch_size={TRAIN_BATCH}",
            f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
            "algorithm.adv_estimator=grpo",
            "trainer.n_gpus_per_node=1",
            "trainer.nnodes=1",
            "recipe.cap.min_tokens=16",
            *overrides,
        ])
    OmegaConf.resolve(cfg)
    return cfg


def build_agent_loop(cfg, server, tokenizer, name: str | None = None, tools=None):
    """The agent loop ``name`` (default: the config's default loop) from configs/agent_loops.yaml, built with the same
    instantiate call as verl's ``AgentLoopWorker._run_agent_loop``. Build it inside the event loop that runs it."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    from recipe.adapter.dataset import LengthAwareRLHFDataset

    agent = cfg.actor_rollout_ref.rollout.agent
    name = name or agent.default_agent_loop
    entry = next(e for e in OmegaConf.load(agent.agent_loop_config_path) if e.name == name)
    extra = {"tools": ToolListWrap(tools)} if tools is not None else {}
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
                                   tokenizer=tokenizer, processor=None, hf_model_type="qwen3_moe",
                                   dataset_cls=LengthAwareRLHFDataset, data_config=DictConfigWrap(cfg.data), **extra)
