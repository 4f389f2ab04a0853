"""README.md's first screen says what is on by default: each row of its defaults table is checked against the code
(recipe/preflight/knobs.py), so a default that changes without the README fails here."""
import re
from pathlib import Path

import pytest

from recipe.preflight import KNOB

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
SECTION = README.split("## What is on by default", 1)[1].split("\n## ", 1)[0]
ROWS = [[c.strip() for c in line.strip("|").split("|")] for line in SECTION.splitlines()
        if line.startswith("|") and not line.startswith("|---") and not line.startswith("| feature")]

# variable -> (what the README's default column must say, the code's default it stands for)
ON_OFF = {"1": "on", "0": "off"}
EXPECTED = {
    "BASELINE_NO_RESAMPLE": "on",  # the feature (the sampler) is on: the switch that turns it off defaults to 0
    "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "on",
    "TAIL_CUT_ENABLE": "off",
    "OVER_SAMPLE_ENABLE": "off",
    "ROLLOUT_SCHEDULING_POLICY": "`fcfs`",
    "ROLLOUT_SPECULATIVE": "`off`",
    "POLICY_PRESET": "unset",
    "MULTI_TURN": "off",
    "SAVE_CKPT_ENABLE": "off",
    "VLLM_EAGER_BASELINE_NO_RESAMPLE": "off",
}


def row_for(var: str) -> list[str]:
    hits = [r for r in ROWS if re.search(rf"`{var}(=[^`]*)?`", r[1])]
    assert len(hits) == 1, f"README's defaults table has {len(hits)} rows whose switch is {var}"
    return hits[0]


@pytest.mark.parametrize("var", sorted(EXPECTED))
def test_the_defaults_table_matches_the_code(var):
    default = KNOB[var].default
    said = row_for(var)[2]
    assert said.startswith(EXPECTED[var]), f"README says {var}'s feature is {said!r}"
    if var == "BASELINE_NO_RESAMPLE":
        assert default == "0"
    elif EXPECTED[var] in ("on", "off"):
        assert ON_OFF[default] == EXPECTED[var], (var, default)
    elif EXPECTED[var] == "unset":
        assert default == ""
    else:
        assert f"`{default}`" == EXPECTED[var], (var, default)


def test_the_cap_mode_and_router_replay_defaults():
    assert f"`{KNOB['VLLM_ROLLOUT_EARLY_STOP_MODE'].default}`" in row_for("VLLM_ROLLOUT_EARLY_STOP_MODE")[2]
    assert "`R3` for an MoE model on Megatron" in row_for("ROUTER_REPLAY")[2]
    assert "R3" in KNOB["ROUTER_REPLAY"].default_doc and "MoE" in KNOB["ROUTER_REPLAY"].default_doc


def test_the_quick_start_names_the_recipes_switches():
    """The switches the recipe is known by, in the quick start a newcomer copies."""
    quick = README.split("## Quick start on a GPU cluster", 1)[1].split("\n## ", 1)[0]
    for switch in ("MODEL_PATH=", "DISTCP_PATH=", "TRAIN_FILE=", "TEST_FILE=", "SAVE_CKPT_ENABLE=1",
                   "VLLM_EAGER_BASELINE_NO_RESAMPLE=1", "BASELINE_NO_RESAMPLE=1", "POLICY_PRESET="):
        assert switch in quick, switch
    assert "--output /data/aime24.parquet" in quick  # the TEST_FILE it uses is made there
    assert KNOB["POLICY_PRESET"].choices and "best-onpolicy-spec" in KNOB["POLICY_PRESET"].choices
