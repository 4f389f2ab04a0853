"""The README's speed table (recipe/sim/speed_table.py): each row's figure is its printed ``python -m recipe.sim``
command's, and each drafter row reads its acceptance from a curve file that names its source."""
import json
from pathlib import Path

import pytest

from recipe.sim import speed_table as S
from recipe.sim.__main__ import build_parser, history_curve
from recipe.sim.corpus_limits import EngineLimits
from recipe.sim.speculation import AcceptanceCurve

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--prompts", "64", "--n", "4", "--epochs", "2", "--batch-size", "16")


def test_every_drafter_row_reads_a_curve_file_that_names_its_source():
    for row in S.ROWS:
        if row.policy in ("best-onpolicy-spec", "onpolicy-spec-tail"):
            i = row.args.index("--acceptance-curve")
            report = json.loads((ROOT / row.args[i + 1]).read_text())
            assert report["source"] and report["label"], row
            AcceptanceCurve.from_report(report, row.args[row.args.index("--drafter") + 1])
        else:
            assert "--acceptance-curve" not in row.args and "no drafting" in row.workload


@pytest.mark.parametrize("row", [S.ROWS[2], S.ROWS[-3]], ids=lambda r: r.policy)
def test_a_rows_figure_is_its_commands(row, capsys):
    """The table's figure for one seed equals what the printed command prints (on a small shape)."""
    from recipe.sim.__main__ import main

    got = S.measure(row, seeds=[1], extra=SMALL)
    assert row.command(SMALL).startswith(".venv/bin/python -m recipe.sim --policies ")
    assert main(row.argv(1, SMALL)) == 0
    report = json.loads(capsys.readouterr().out)
    policy = next(p for p in report["policies"] if p["name"] == row.policy)
    assert got["speedups"] == [policy["speedup_vs_baseline"]]
    if "--acceptance-curve" in row.args:
        assert got["acceptance"] == report["speculation"]["acceptance_length_source"]
        assert "history" in got["acceptance"] and "router" in got["acceptance"]


def test_a_history_drafter_finds_its_history_where_the_engine_keeps_it():
    """own + group + history is mixed with own + group at the engine's share (the router's homes and guard, the texts
    kept); a drafter without history, or a report without the drafter without history, is left as it is."""
    report = {"drafters": {"suffix:own+group:k=4": {"tokens_per_step": 1.5, "draft_tokens_per_step": 2.0},
                           "suffix:own+group+history:k=4": {"tokens_per_step": 2.0, "draft_tokens_per_step": 3.0}}}
    name = "suffix:own+group+history:k=4"
    curve = AcceptanceCurve.from_report(report, name, "f")
    lim = EngineLimits(prompts=1024, kept=1000)  # 1000 texts: 7.8 steps of history against 32-step epochs
    mixed = history_curve(report, name, curve, lim)
    share = lim.history_share
    assert 0 < share < 0.1
    assert mixed.tau == pytest.approx((share * 2.0 + (1 - share) * 1.5,))
    assert mixed.drafted == pytest.approx((share * 3.0 + (1 - share) * 2.0,))
    assert f"{share:.1%} of the responses with their history" in mixed.source
    plain = AcceptanceCurve.from_report(report, "suffix:own+group:k=4")
    assert history_curve(report, "suffix:own+group:k=4", plain, lim) is plain
    alone = {"drafters": {name: report["drafters"][name]}}
    assert history_curve(alone, name, curve, lim) is curve
    with pytest.raises(ValueError, match="draft_tokens_per_step"):
        AcceptanceCurve.from_report({"x": {"tokens_per_step": 1.5}}, "x")


def test_the_table_parses_as_the_simulator_does():
    for row in S.ROWS:
        args = build_parser().parse_args(row.argv(0))
        assert args.policies == row.policy and args.seed == 0
