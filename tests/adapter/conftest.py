"""The recipe's composed config pointed at the tiny local artifacts."""
import pytest

from recipe.testing.recipe_config import compose_recipe


@pytest.fixture
def recipe_config(tiny_artifacts, tmp_path):
    return compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={tmp_path}/run"])
