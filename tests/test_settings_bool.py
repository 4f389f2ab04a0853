"""The one parser of 0/1 switches (``recipe.settings.parse_bool``): environment variables and config keys agree."""
import pytest

from recipe.settings import RecipeConfigError, as_bool, parse_bool


@pytest.mark.parametrize("raw, expected", [("1", True), ("0", False), ("true", True), ("FALSE", False),
                                           (" True ", True), ("\t0\n", False)])
def test_accepted_spellings_parse_the_same_for_variables_and_keys(raw, expected):
    assert parse_bool(raw) is expected
    assert as_bool(raw, "recipe.cap.enable") is expected


@pytest.mark.parametrize("raw", ["yes", "2", "", "on", "1.0"])
def test_other_strings_are_rejected_with_the_accepted_spellings(raw):
    with pytest.raises(ValueError, match=r"must be 0 or 1 \(or true/false\)"):
        parse_bool(raw)
    with pytest.raises(RecipeConfigError, match=r"recipe.cap.enable \(env VLLM_ROLLOUT_EARLY_STOP_ENABLE\) must be "
                                                r"0/1 or true/false"):
        as_bool(raw, "recipe.cap.enable")


def test_config_values_may_also_be_bools_and_the_ints_0_and_1():
    assert as_bool(True, "k") is True and as_bool(1, "k") is True and as_bool(0, "k") is False
    for bad in (2, 1.0, None, [1]):
        with pytest.raises(RecipeConfigError, match="k must be 0/1 or true/false"):
            as_bool(bad, "k")
