"""Control run for the e2e tests (conftest.py ``restart_without_sync_run``): the recipe's trainer with the weight
push to vLLM removed.

``python tests/e2e/no_weight_sync_driver.py --config-name NAME [overrides]`` composes the config exactly as
``python -m recipe.main`` does and runs verl's loop with ``LengthAwareTrainer`` minus ``on_step_end`` (where verl's
sync trainer pushes the updated weights to vLLM): vLLM keeps the weights it got at start-up, so verl's
``training/rollout_probs_diff_*`` must grow as the actor learns. Test code, not part of the recipe.
"""
import argparse

import ray
from hydra import compose, initialize_config_dir

from recipe.adapter.task_runner import LengthAwareTaskRunner
from recipe.main import CONFIGS_DIR, prepare_config


class NoWeightSyncTaskRunner(LengthAwareTaskRunner):
    def run(self, config):
        import recipe.adapter.trainer as trainer_module

        class NoWeightSyncTrainer(trainer_module.LengthAwareTrainer):
            def on_step_end(self):
                # verl's PPOTrainerSync.on_step_end (checkpoint_manager.update_weights) is skipped; the recipe's
                # own part (re-opening generation after an over-sample abort) is kept
                if self.over_sample is not None:
                    self.over_sample.resume(self)

        trainer_module.LengthAwareTrainer = NoWeightSyncTrainer  # what LengthAwareTaskRunner.run registers
        return super().run(config)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-name", required=True)
    args, overrides = parser.parse_known_args()
    from verl.trainer.main_ppo import run_ppo

    with initialize_config_dir(config_dir=CONFIGS_DIR, version_base=None):
        cfg = compose(config_name=args.config_name, overrides=overrides)
    run_ppo(prepare_config(cfg), task_runner_class=ray.remote(num_cpus=1)(NoWeightSyncTaskRunner))
