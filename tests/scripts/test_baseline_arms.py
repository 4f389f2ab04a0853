"""The comparison arms differ from the resampler arm in exactly the keys docs/training.md names, and in nothing else.

``BASELINE_NO_RESAMPLE=1`` (the fair baseline) turns the sampler and the cap off and reads the data in verl's seeded
random order; ``VLLM_EAGER_BASELINE_NO_RESAMPLE=1`` (the seed's baseline) does the same and also runs vLLM eagerly,
so the seed's pair measures sampler + cap *and* the vLLM mode together. Each arm's resolved config (what
``DRY_RUN=1`` composes, verl 0.9.1 + the recipe YAML, 30B layout) is diffed key by key against the resampler's;
keys that differ only by the experiment name (run directory, log paths, the name itself) are the arms' identities,
not settings.
"""
import functools

import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight

ARR = "actor_rollout_ref"
# What turns a resampler run into a baseline run (docs/training.md, "Baseline vs resampler").
FAIR = {"data.sampler.class_path", "recipe.cap.enable", "data.shuffle"}
EAGER = FAIR | {f"{ARR}.rollout.enforce_eager"}


def flat(node, prefix=""):
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    out = {}
    for k, v in node.items():
        out.update(flat(v, f"{prefix}{k}."))
    return out


def resolved(env):
    """(flat resolved config, experiment name); each environment is composed once per session (~1 s each)."""
    return _resolved(tuple(sorted(env.items())))


@functools.lru_cache(maxsize=None)
def _resolved(env_items):
    report = run_preflight([], dict(env_items))
    assert report.ok, report.errors
    c = flat(OmegaConf.to_container(report.config, resolve=True))
    return c, c["trainer.experiment_name"]


def config_diff(a_env, b_env):
    """Keys whose resolved values differ, except where they differ only by the experiment name."""
    a, a_name = resolved(a_env)
    b, b_name = resolved(b_env)
    assert a_name != b_name  # every arm has its own run directory
    missing = object()
    return {k: (a.get(k, missing), b.get(k, missing)) for k in a.keys() | b.keys()
            if str(a.get(k, missing)).replace(a_name, "<run>") != str(b.get(k, missing)).replace(b_name, "<run>")}


@pytest.mark.parametrize("switch,keys,name", [
    ("BASELINE_NO_RESAMPLE", FAIR, "qwen3-30b-a3b-grpo-baseline"),
    ("VLLM_EAGER_BASELINE_NO_RESAMPLE", EAGER, "qwen3-30b-a3b-grpo-baseline-eager"),
])
def test_baseline_arm_differs_from_the_resampler_in_exactly_the_readme_keys(env_30b, switch, keys, name):
    diff = config_diff(env_30b, {**env_30b, switch: "1"})
    assert set(diff) == keys, sorted(diff)
    assert diff["data.sampler.class_path"] == ("pkg://recipe.adapter.sampler", None)  # verl's own sampler
    assert diff["recipe.cap.enable"] == (1, 0)
    assert diff["data.shuffle"] == (False, True)  # verl's RandomSampler, seeded by data.seed
    if f"{ARR}.rollout.enforce_eager" in keys:
        assert diff[f"{ARR}.rollout.enforce_eager"] == (False, True)
    assert resolved({**env_30b, switch: "1"})[1] == name


def test_both_baselines_share_the_seed_of_verls_random_order(env_30b):
    resampler, _ = resolved(env_30b)
    fair, _ = resolved({**env_30b, "BASELINE_NO_RESAMPLE": "1"})
    eager, _ = resolved({**env_30b, "VLLM_EAGER_BASELINE_NO_RESAMPLE": "1"})
    assert fair["data.seed"] == eager["data.seed"] == resampler["data.seed"] == resampler["data.sampler.seed"] == 0
    assert config_diff({**env_30b, "BASELINE_NO_RESAMPLE": "1"},
                       {**env_30b, "VLLM_EAGER_BASELINE_NO_RESAMPLE": "1"}).keys() == {f"{ARR}.rollout.enforce_eager"}
    seeded = resolved({**env_30b, "BASELINE_NO_RESAMPLE": "1", "DATA_SEED": "7"})[0]
    assert (seeded["data.seed"], seeded["data.shuffle"]) == (7, True)


def test_the_arm_switches_exclude_each_other(env_30b):
    report = run_preflight([], {**env_30b, "BASELINE_NO_RESAMPLE": "1", "VLLM_EAGER_BASELINE_NO_RESAMPLE": "1"})
    assert any("name two baseline arms" in e for e in report.errors), report.errors
