"""RECORD_TOKENS and RECORD_TOKENS_MAX_MB: from the variables through the overrides and the composed config to the
recipe's settings (off by default), and bad values refused by the preflight with the variable named."""
import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight
from recipe.settings import parse_settings


def record_settings(report):
    return parse_settings(OmegaConf.to_container(report.config, resolve=True)).record_tokens


def test_off_by_default_and_on_with_its_bound(env_30b):
    off = run_preflight([], env_30b)
    assert off.ok, off.errors
    assert "recipe.record_tokens.enable=0" in off.overrides and "recipe.record_tokens.max_mb=1024" in off.overrides
    s = record_settings(off)
    assert (s.enabled, s.max_mb, s.path) == (False, 1024, None)
    on = run_preflight([], {**env_30b, "RECORD_TOKENS": "1", "RECORD_TOKENS_MAX_MB": "64"})
    assert on.ok, on.errors
    s = record_settings(on)
    assert (s.enabled, s.max_mb) == (True, 64)
    assert on.config.trainer.experiment_name == off.config.trainer.experiment_name  # recording is no A/B arm


@pytest.mark.parametrize("env,parts", [
    ({"RECORD_TOKENS": "yes"}, ["RECORD_TOKENS=", "must be 0 or 1"]),
    ({"RECORD_TOKENS": "1", "RECORD_TOKENS_MAX_MB": "0"}, ["RECORD_TOKENS_MAX_MB=", ">= 1"]),
    ({"RECORD_TOKENS": "1", "RECORD_TOKENS_MAX_MB": "lots"}, ["RECORD_TOKENS_MAX_MB=", "integer"]),
])
def test_bad_values_are_refused_by_name(env_30b, env, parts):
    report = run_preflight([], {**env_30b, **env})
    assert not report.ok
    assert any(all(p in e for p in parts) for e in report.errors), report.errors
