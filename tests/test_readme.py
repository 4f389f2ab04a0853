"""README.md's first screen says what is on by default: each row of its defaults table is checked against the code
(recipe/preflight/knobs.py), so a default that changes without the README fails here."""
import re
from pathlib import Path

import pytest

from recipe.preflight import KNOB

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
PROSE = " ".join(README.split())  # the README's words, whatever the line wrapping
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


def test_every_speed_figure_names_its_source():
    """A speed-up in the defaults table says where it comes from (issue 46: figures from two simulators on two GPUs
    read as one): each ``N.NNx`` in the "what it buys" column carries a ``[...]`` source tag, and each tag is
    explained with its command under the table."""
    sources = " ".join(SECTION[SECTION.rindex("|"):].split())  # the prose under the table, unwrapped
    tags = set()
    for row in ROWS:
        for cell in re.split(r"(?<=\])", row[3]):
            if re.search(r"\d\.\d+x", cell):
                tag = re.search(r"\[([^\]]+)\]\s*$", cell.strip())
                assert tag, f"README's speed figure without a source: {row[0]!r}: {cell.strip()!r}"
                tags.add(tag.group(1))
    assert tags, "no speed figure found in the defaults table"
    for tag in tags:
        assert f"**[{tag}]**" in sources, f"source [{tag}] is not explained under the table"
    assert "python -m recipe.sim" in sources and "bench/group_drafter_sim.py" in sources


def test_the_logger_defaults_are_stated():
    """What a newcomer's run logs to, as the code does it: the loggers' default, wandb online only with a key, and the
    project's name."""
    assert f"`TRAINER_LOGGER={KNOB['TRAINER_LOGGER'].default}`" in PROSE
    assert "wandb" in KNOB["TRAINER_LOGGER"].default and "WANDB_API_KEY" in KNOB["WANDB_MODE"].default_doc
    assert "online when `WANDB_API_KEY` is set, offline" in PROSE
    assert f"`PROJECT_NAME` (`{KNOB['PROJECT_NAME'].default}`)" in PROSE
    assert "disabled" in KNOB["WANDB_MODE"].choices and "`WANDB_MODE=disabled`" in PROSE
