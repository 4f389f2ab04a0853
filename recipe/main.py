"""Entry point: ``python -m recipe.main [--config-name length_aware_grpo_cpu] [hydra overrides]``.

Composes ``configs/length_aware_grpo.yaml`` (verl's ppo_megatron_trainer + recipe keys; ``length_aware_grpo_cpu``:
verl's FSDP trainer for the CPU preset), resolves it on the driver
(environment defaults are read here, where the user set them), runs verl's ``validate_config`` and the recipe's
checks, then verl's ``run_ppo`` with the recipe's TaskRunner.
"""
from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig, OmegaConf

CONFIGS_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "configs"))


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("recipe_configs_dir"):
        OmegaConf.register_new_resolver("recipe_configs_dir", lambda: CONFIGS_DIR)


register_resolvers()


def prepare_config(config: DictConfig) -> DictConfig:
    """Resolve, validate with verl and the recipe, and return the config ready for ``run_ppo`` (CPU only)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from .settings import parse_settings

    OmegaConf.resolve(config)
    parse_settings(OmegaConf.to_container(config))
    if config.trainer.device != "cpu":  # the CPU config names its device; verl would turn it into the detected one
        auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return config


@hydra.main(config_path="../configs", config_name="length_aware_grpo", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo

    from .adapter.task_runner import LengthAwareTaskRunnerActor

    config = prepare_config(config)
    if config.trainer.device == "cpu" and os.environ.get("VERL_PLATFORM") != "cpu":
        raise SystemExit("trainer.device=cpu needs the recipe's CPU platform in every process: run "
                         "`PRESET=cpu bash scripts/train_grpo.sh` (it exports VERL_PLATFORM=cpu and "
                         "VERL_USE_EXTERNAL_MODULES=recipe.cpu.verl_platform; see recipe/cpu/preset.py)")
    run_ppo(config, task_runner_class=LengthAwareTaskRunnerActor)


if __name__ == "__main__":
    main()
