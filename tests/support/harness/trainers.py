"""A ``LengthAwareTrainer`` on the tiny artifacts, without workers: for the adapter tests that drive verl's hooks."""
from __future__ import annotations

from recipe.route_record.config import compose_recipe


def make_trainer(tiny_artifacts, tmp_path, *overrides):
    """A LengthAwareTrainer on the tiny artifacts with its tokenizer and dataloader, at step 1 (no workers)."""
    from recipe.adapter.trainer import LengthAwareTrainer

    cfg = compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={tmp_path}/run", *overrides])
    trainer = LengthAwareTrainer(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer.global_steps = 1
    return trainer
