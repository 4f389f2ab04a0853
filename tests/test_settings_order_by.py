"""``data.sampler.order_by`` and ``data.sampler.time_tokens_per_s`` (recipe/settings.py): defaults, and bad values
refused with the key, the variable behind it and the fix."""
import re

import pytest

from recipe.settings import SAMPLER_CLASS_NAME, SAMPLER_CLASS_PATH, RecipeConfigError, parse_settings


def sampler_settings(**sampler):
    return parse_settings({"data": {"train_batch_size": 1, "max_response_length": 64, "sampler": {
        "class_path": SAMPLER_CLASS_PATH, "class_name": SAMPLER_CLASS_NAME, **sampler}}}).sampler


def test_defaults_order_by_tokens_at_120_tokens_per_s():
    s = sampler_settings()
    assert (s.order_by, s.time_tokens_per_s) == ("tokens", 120.0)
    s = sampler_settings(order_by="time", time_tokens_per_s="60")
    assert (s.order_by, s.time_tokens_per_s) == ("time", 60.0)


@pytest.mark.parametrize("value", ["latency", "Time", ""])
def test_unknown_order_is_refused_by_key_and_variable(value):
    with pytest.raises(RecipeConfigError, match=re.escape("data.sampler.order_by (env SAMPLER_ORDER_BY) must be one "
                                                          "of ('tokens', 'time')") + ".*SAMPLER_ORDER_BY=tokens"):
        sampler_settings(order_by=value)


@pytest.mark.parametrize("value,reason", [(0, "must be > 0"), (-5.0, "must be > 0"), ("fast", "must be a number"),
                                          (float("nan"), "must be a number")])
def test_non_positive_tokens_per_s_is_refused_by_key_and_variable(value, reason):
    with pytest.raises(RecipeConfigError, match=re.escape("data.sampler.time_tokens_per_s (env "
                                                          f"SAMPLER_TIME_TOKENS_PER_S) {reason}")):
        sampler_settings(order_by="time", time_tokens_per_s=value)
