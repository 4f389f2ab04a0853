"""The Ray TaskRunner that runs verl's v1 loop with ``LengthAwareTrainer`` in place of ``PPOTrainerSync``.

verl's ``TaskRunnerV1.run`` picks the trainer with ``get_trainer_cls(config.trainer.v1.trainer_mode)``. A new mode
name would switch on verl's async-only branches (they test ``trainer_mode != "sync"``), so the config keeps
``trainer_mode=sync`` and this runner, in its own actor process, maps "sync" to the recipe trainer in verl's public
trainer registry for the duration of ``run``. Everything else is verl's ``run`` unchanged.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import ray
from verl.trainer.main_ppo import TaskRunnerV1


@contextmanager
def sync_trainer_is(trainer_cls):
    # imported here, in the actor: the driver imports this module only to launch the actor, and verl's v1 trainer
    # stack costs it several seconds of start-up per run
    from verl.trainer.ppo.v1 import trainer_base

    registry = trainer_base.TRAINER_REGISTRY
    previous = registry.get("sync")
    registry["sync"] = trainer_cls
    try:
        yield
    finally:
        registry["sync"] = previous


class LengthAwareTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def run(self, config):
        from .trainer import LengthAwareTrainer

        if config.trainer.v1.trainer_mode != "sync":
            raise ValueError(
                f"trainer.v1.trainer_mode={config.trainer.v1.trainer_mode!r}: the length-aware recipe runs on the "
                "sync v1 trainer; set trainer.v1.trainer_mode=sync"
            )
        make_file_logger_dir()
        try:
            with sync_trainer_is(LengthAwareTrainer):
                return super().run(config)
        finally:
            _teardown_wandb()


def make_file_logger_dir() -> None:
    """Create the directory of ``VERL_FILE_LOGGER_PATH`` where this actor runs: verl's file logger opens that path
    with "wb" and creates no directory (``verl/utils/tracking.py:534-541``), and the launcher creates the run's
    ``logs/`` only on its own node, so a TaskRunner placed on another node would fail at its first log line."""
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    if path and os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)


def _teardown_wandb() -> None:
    """verl finishes its wandb run in ``run``; wandb's own atexit teardown then runs again while Ray ends this actor
    and its wandb service process, and prints a ConnectionResetError traceback after every successful run. Tearing
    wandb down here, in order, leaves its atexit hook nothing to do."""
    import sys

    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


LengthAwareTaskRunnerActor = ray.remote(num_cpus=1)(LengthAwareTaskRunner)
