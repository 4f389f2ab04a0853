"""TAIL_CUT_MAX_EXTRA_TRUNCATION: from the variable through the override and the composed config to the recipe's
settings, and every bad value refused by the preflight with the variable named."""
import pytest

from recipe.preflight import run_preflight
from recipe.settings import parse_settings


def error_with(report, *parts):
    assert not report.ok
    hits = [e for e in report.errors if all(p in e for p in parts)]
    assert hits, f"no error with {parts}:\n" + "\n".join(report.errors)


def test_budget_flows_to_the_settings(env_30b):
    report = run_preflight([], {**env_30b, "TAIL_CUT_ENABLE": "1", "TAIL_CUT_MAX_EXTRA_TRUNCATION": "0.01"})
    assert report.ok, report.errors
    assert "recipe.tail_cut.max_extra_truncation=0.01" in report.overrides
    assert report.config["recipe"]["tail_cut"]["max_extra_truncation"] == 0.01
    from omegaconf import OmegaConf

    tc = parse_settings(OmegaConf.to_container(report.config, resolve=True)).tail_cut
    assert tc.enabled and tc.max_extra_truncation == 0.01 and tc.fraction == 0.975
    off = run_preflight([], env_30b)
    assert off.ok and off.config["recipe"]["tail_cut"]["max_extra_truncation"] == 0.0


@pytest.mark.parametrize("value,parts", [
    ("-0.01", ["TAIL_CUT_MAX_EXTRA_TRUNCATION=", "must be >= 0"]),
    ("abc", ["TAIL_CUT_MAX_EXTRA_TRUNCATION=", "must be a number"]),
    ("nan", ["TAIL_CUT_MAX_EXTRA_TRUNCATION=", "finite number"]),
    ("0.7", ["TAIL_CUT_MAX_EXTRA_TRUNCATION", "<= 0.5"]),
])
def test_bad_budget_is_refused_by_name(env_30b, value, parts):
    error_with(run_preflight([], {**env_30b, "TAIL_CUT_ENABLE": "1", "TAIL_CUT_MAX_EXTRA_TRUNCATION": value}), *parts)


def test_budget_without_the_cut_is_refused(env_30b):
    error_with(run_preflight([], {**env_30b, "TAIL_CUT_MAX_EXTRA_TRUNCATION": "0.01"}),
               "TAIL_CUT_MAX_EXTRA_TRUNCATION", "set recipe.tail_cut.enable (env TAIL_CUT_ENABLE)=1")
