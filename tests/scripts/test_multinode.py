"""Multi-node launch: what a TaskRunner or worker on another node gets only through the Ray runtime env.

verl adds ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron's TP/SP communication overlap) only when the launching process
itself sees a Hopper/Ampere GPU, and a worker on another node imports only what its own PYTHONPATH holds; a
launcher with ``RAY_ADDRESS`` and no GPU (this machine) is exactly the case that silently lost both. verl's file
logger opens ``VERL_FILE_LOGGER_PATH`` with "wb" and creates no directory, so the TaskRunner creates it.
"""
import inspect
import os
from unittest import mock

import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight
from recipe.preflight.overrides import actor_pythonpath
from harness.cpu_runs import CPU_RANDOM

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ray_init_env_vars(config) -> dict:
    """The ``env_vars`` verl's ``run_ppo`` hands to ``ray.init`` for ``config`` (Ray and the runner mocked)."""
    import ray
    from verl.trainer.main_ppo import run_ppo

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
        run_ppo(config, task_runner_class=Runner)
    return seen["runtime_env"]["env_vars"]


def test_verl_adds_cuda_device_max_connections_only_for_a_launcher_that_sees_a_hopper_gpu(monkeypatch):
    """The premise (verl/trainer/constants_ppo.py): the launcher's own device capability decides."""
    from verl.trainer import constants_ppo

    source = inspect.getsource(constants_ppo.get_ppo_ray_runtime_env)
    assert "if _is_hopper_or_ampere and _uses_megatron(config):" in source
    assert 'runtime_env["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"' in source
    assert "_major, _ = get_device_capability()" in inspect.getsource(constants_ppo)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    megatron = OmegaConf.create({"actor_rollout_ref": {"actor": {"strategy": "megatron"}}})
    for hopper in (True, False):
        monkeypatch.setattr(constants_ppo, "_is_hopper_or_ampere", hopper)
        env_vars = constants_ppo.get_ppo_ray_runtime_env(megatron)["env_vars"]
        assert ("CUDA_DEVICE_MAX_CONNECTIONS" in env_vars) is hopper


def test_gpu_less_launcher_still_sends_connections_and_pythonpath_to_every_actor(env_30b):
    from ray._private.runtime_env.validation import parse_and_validate_env_vars
    from verl.trainer import constants_ppo

    env = {**env_30b, "PYTHONPATH": f"{REPO}:/opt/site-extra::/opt/site-extra"}  # as train_grpo.sh exports it
    report = run_preflight([], env)
    assert report.ok, report.errors
    with mock.patch.object(constants_ppo, "_is_hopper_or_ampere", False):  # a launcher without a GPU
        env_vars = ray_init_env_vars(report.config)
    assert env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env_vars["PYTHONPATH"] == f"{REPO}:/opt/site-extra"
    assert env_vars["VERL_FILE_LOGGER_PATH"].endswith("/logs/metrics.20260101T000000Z.jsonl")
    parse_and_validate_env_vars(env_vars)  # Ray rejects any non-string value (an unquoted 1 would be an int)


def test_connections_value_comes_from_the_environment(env_30b):
    report = run_preflight([], {**env_30b, "CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert report.ok, report.errors
    assert OmegaConf.select(report.config, "ray_kwargs.ray_init.runtime_env.env_vars.CUDA_DEVICE_MAX_CONNECTIONS") \
        == "8"
    report = run_preflight([], {**env_30b, "CUDA_DEVICE_MAX_CONNECTIONS": "0"})
    assert any(e.startswith("CUDA_DEVICE_MAX_CONNECTIONS='0' must be >= 1") for e in report.errors), report.errors


def test_cpu_preset_gets_pythonpath_but_not_the_megatron_setting(tmp_path):
    """verl: FSDP must not run with CUDA_DEVICE_MAX_CONNECTIONS=1; only the Megatron configs send it."""
    report = run_preflight([], {**CPU_RANDOM, "CKPT_ROOT": str(tmp_path), "PYTHONPATH": ""})
    assert report.ok, report.errors
    env_vars = OmegaConf.to_container(report.config.ray_kwargs.ray_init.runtime_env.env_vars)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env_vars
    assert env_vars["PYTHONPATH"] == REPO


@pytest.mark.parametrize("launcher,expected", [
    ("", REPO),
    ("/a", f"{REPO}:/a"),
    (f"{REPO}:/a:/b:/a:", f"{REPO}:/a:/b"),
    (f"/a:{REPO}", f"{REPO}:/a"),
])
def test_actor_pythonpath_puts_the_checkout_first_once(launcher, expected):
    assert actor_pythonpath(launcher) == expected


# ---- the run's log directory, created where the TaskRunner runs --------------------------------------------------

def test_verl_file_logger_needs_the_directory_and_the_task_runner_creates_it(tmp_path, monkeypatch):
    from verl.utils.tracking import FileLogger

    from recipe.adapter.task_runner import make_file_logger_dir

    path = tmp_path / "run" / "logs" / "metrics.20260101T000000Z.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    with pytest.raises(FileNotFoundError):  # what a TaskRunner on a node without the run's logs/ hit
        FileLogger("p", "e")
    make_file_logger_dir()
    make_file_logger_dir()  # idempotent: every launch and resume calls it
    logger = FileLogger("p", "e")
    logger.log({"x": 1}, step=1)
    logger.finish()
    assert path.read_text().startswith('{"step":1')


def test_make_file_logger_dir_without_the_variable_does_nothing(tmp_path, monkeypatch):
    from recipe.adapter.task_runner import make_file_logger_dir

    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    make_file_logger_dir()
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", "metrics.jsonl")  # a bare file name: the working dir exists
    make_file_logger_dir()
    assert list(tmp_path.iterdir()) == []


def test_task_runner_creates_the_log_dir_before_verls_run(tmp_path, monkeypatch):
    from verl.trainer.main_ppo import TaskRunnerV1

    from recipe.adapter.task_runner import LengthAwareTaskRunner

    logs = tmp_path / "logs"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(logs / "metrics.jsonl"))
    seen = {}
    with mock.patch.object(TaskRunnerV1.__ray_actor_class__, "run",
                           side_effect=lambda config: seen.setdefault("dir", logs.is_dir())):
        LengthAwareTaskRunner().run(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "sync"}}}))
    assert seen == {"dir": True}
