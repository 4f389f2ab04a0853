"""SAMPLER_ORDER_BY and SAMPLER_TIME_TOKENS_PER_S: from the variables through the overrides and the composed config to
the recipe's settings, and bad values refused by the preflight with the variable named."""
import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight
from recipe.settings import parse_settings


def error_with(report, *parts):
    assert not report.ok
    hits = [e for e in report.errors if all(p in e for p in parts)]
    assert hits, f"no error with {parts}:\n" + "\n".join(report.errors)


def sampler_of(report):
    assert report.ok, report.errors
    return parse_settings(OmegaConf.to_container(report.config, resolve=True)).sampler


def test_order_by_time_flows_to_the_settings(env_30b):
    report = run_preflight([], {**env_30b, "SAMPLER_ORDER_BY": "time", "SAMPLER_TIME_TOKENS_PER_S": "60"})
    assert {"data.sampler.order_by=time", "data.sampler.time_tokens_per_s=60.0"} <= set(report.overrides)
    s = sampler_of(report)
    assert (s.order_by, s.time_tokens_per_s) == ("time", 60.0)
    assert "ordered by time at 60.0 tokens/s" in dict(report.table)["sampler"]


def test_default_is_tokens(env_30b):
    report = run_preflight([], env_30b)
    s = sampler_of(report)
    assert (s.order_by, s.time_tokens_per_s) == ("tokens", 120.0)
    assert "ordered by time" not in dict(report.table)["sampler"]


@pytest.mark.parametrize("env,parts", [
    ({"SAMPLER_ORDER_BY": "latency"}, ["SAMPLER_ORDER_BY=", "must be one of 'tokens', 'time'"]),
    ({"SAMPLER_TIME_TOKENS_PER_S": "abc"}, ["SAMPLER_TIME_TOKENS_PER_S=", "must be a number"]),
    ({"SAMPLER_TIME_TOKENS_PER_S": "-1"}, ["SAMPLER_TIME_TOKENS_PER_S=", "must be >= 0"]),
    ({"SAMPLER_ORDER_BY": "time", "SAMPLER_TIME_TOKENS_PER_S": "0"},
     ["data.sampler.time_tokens_per_s (env SAMPLER_TIME_TOKENS_PER_S) must be > 0"]),
])
def test_bad_values_are_refused_by_name(env_30b, env, parts):
    error_with(run_preflight([], {**env_30b, **env}), *parts)
