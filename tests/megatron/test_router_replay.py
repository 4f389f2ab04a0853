"""R3 end to end on the CPU: vLLM CPU records each token's routed experts and log-prob, Megatron-Core replays them
through verl's router-replay code (``python -m recipe.megatron_check replay``, :mod:`recipe.megatron_check.replay`
has the measured numbers).

The engine runs here (``recipe.route_record.record``, what ``scripts/gpu_check.sh --fetch-wheels`` records for the
lent GPU); the Megatron check in a subprocess (Megatron's process groups are global to a process) reads the recorded
sequences from ``.npz`` files and writes its rows as JSON, which the tests assert on. The recipe's paths replay on the
tiny random model and, multi-turn, on the trained one; a second check on the same recordings with one path's routes
shifted by a token must fail. ~3 min on 2 cores.
"""
import json
import sys

import pytest

from harness.megatron_site import run_with_megatron

pytestmark = [pytest.mark.megatron, pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_artifacts, vllm_engine, route_records):
    from recipe.route_record.record import record

    return record(tmp_path_factory.mktemp("router-replay"), tiny_artifacts, vllm_engine, route_records)


def replay_check(work, paths, name, expect_ok=True) -> dict:
    """``python -m recipe.megatron_check replay`` on ``work``'s model and rollouts with ``paths``: its rows by step."""
    out = work / f"{name}.json"
    run_with_megatron([sys.executable, "-m", "recipe.megatron_check", "replay", "--cpu", "--work", str(work / name),
                       "--model", str(work / "model"), "--rollouts", str(work / "rollouts.npz"),
                       "--paths", str(paths), "--json", str(out)], work / f"{name}.log", expect_ok=expect_ok)
    return {r["step"]: r for r in json.loads(out.read_text())}


@pytest.fixture(scope="module")
def rows(recorded):
    return replay_check(recorded, recorded / "paths.npz", "run")


def test_every_step_ran_and_passed(rows):
    assert list(rows) == ["environment", "r3-same-weights", "r3-shifted-routes-detected", "r3-after-optimizer-step",
                          "r3-recipe-paths", "r3-megatron-bf16"]
    assert [s for s, r in rows.items() if not r["ok"]] == []


def test_replay_routes_every_token_as_vllm_did(rows):
    arms = [rows["r3-same-weights"]["data"], rows["r3-megatron-bf16"]["data"],
            *rows["r3-after-optimizer-step"]["data"].values()]
    assert len(arms) == 5
    for data in arms:
        assert data["replay"]["routes"] == 656 and data["replay"]["mismatched"] == 0


def test_same_weights_route_alike_without_replay(rows):
    data = rows["r3-same-weights"]["data"]
    assert data["native"]["mismatched"] == 0  # fp32 on both sides: Megatron's own routing is vLLM's
    assert data["native"]["logprob_gap"] < 1e-5 and data["replay"]["logprob_gap"] < 1e-5


def test_moved_weights_route_apart_unless_replayed(rows):
    shares = [d["native"]["mismatch_share"] for d in rows["r3-after-optimizer-step"]["data"].values()]
    assert 0 < shares[0] < shares[1] < shares[2]  # lr 1e-5, 1e-4, 1e-3
    bf16 = rows["r3-megatron-bf16"]["data"]
    assert bf16["native"]["mismatched"] > 0


def test_a_one_token_shift_of_the_routes_is_caught(rows):
    data = rows["r3-shifted-routes-detected"]["data"]
    assert set(data) == {"by+1", "by-1"}
    for shifted in data.values():
        assert shifted["mismatch_share"] > 0.25
        assert shifted["logprob_gap"] > 100 * rows["r3-same-weights"]["data"]["replay"]["logprob_gap"]


def test_every_recipe_path_replays_as_vllm_routed(rows):
    """Capped, cut by an abort, resumed after a stored part, and handed back from the store (its routes re-prefilled):
    each path's routes are Megatron's own routing of its tokens at the weights vLLM served (an independent forward,
    row for row), and after an optimizer step, Megatron's own routing departs from vLLM's; replayed, every route is
    vLLM's."""
    from recipe.route_record.paths import PATHS

    data = rows["r3-recipe-paths"]["data"]
    assert list(data) == list(PATHS)
    for path, d in data.items():
        assert d["independent"]["routes"] > 100 and d["independent"]["mismatched"] == 0, path
        assert d["independent"]["shifted_share"] > 0.25, path
        assert d["replay"]["routes"] > 100 and d["replay"]["mismatched"] == 0, path
    assert sum(d["native"]["mismatched"] for d in data.values()) > 0


@pytest.fixture(scope="module")
def shifted_path_rows(recorded):
    """The check on the recorded paths with one path's routes moved one token late (row i holds row i + 1's, the
    last repeated): same length, what an off-by-one in a recipe path hands Megatron."""
    from recipe.megatron_check.replay import load_rollouts, save_rollouts, shifted

    paths = load_rollouts(recorded / "paths.npz")
    paths[SHIFTED].routes = shifted(paths[SHIFTED].routes, 1)
    save_rollouts(recorded / "shifted-paths.npz", list(paths.values()), names=list(paths))
    return replay_check(recorded, recorded / "shifted-paths.npz", "shifted", expect_ok=False)


SHIFTED = "resumed"


def test_a_one_token_shift_made_in_a_recipe_path_fails_the_check(shifted_path_rows):
    """The recipe-paths row checks each path against Megatron's own forward, not against the routes it replays:
    replayed, the shifted routes are routed exactly as given (replay cannot tell), and the row fails on them."""
    row = shifted_path_rows["r3-recipe-paths"]
    assert not row["ok"] and f"NOT ALIGNED: {SHIFTED};" in row["detail"]
    data = row["data"]
    assert data[SHIFTED]["independent"]["mismatch_share"] > 0.25
    assert data[SHIFTED]["replay"]["mismatched"] == 0  # what the old check compared: routes with themselves
    assert all(d["independent"]["mismatched"] == 0 for path, d in data.items() if path != SHIFTED)


@pytest.fixture(scope="module")
def tool_rows(tmp_path_factory, tool_route_records):
    """The multi-turn paths (the trained tiny model calling the calculator) recorded on vLLM CPU and replayed on the
    same model: the trajectories are both the optimizer step's data and the paths replayed after it."""
    from recipe.route_record.paths import save_paths

    work = tmp_path_factory.mktemp("router-replay-tools")
    model_dir, records = tool_route_records
    save_paths(work / "paths.npz", records)
    run_with_megatron([sys.executable, "-m", "recipe.megatron_check", "replay", "--cpu", "--work", str(work / "run"),
                       "--model", str(model_dir), "--rollouts", str(work / "paths.npz"),
                       "--paths", str(work / "paths.npz"), "--json", str(work / "rows.json")], work / "replay.log")
    return {r["step"]: r for r in json.loads((work / "rows.json").read_text())}


@pytest.mark.trained_model
def test_multi_turn_trajectories_replay_as_vllm_routed(tool_rows):
    """Tool replies (outside the loss) sit between the assistant turns: their routes come from the next turn's
    prefill; replayed, every route of the trajectory is vLLM's, also for the one handed back from the store."""
    from recipe.route_record.paths import MULTI_TURN_PATHS

    assert [s for s, r in tool_rows.items() if not r["ok"]] == []
    data = tool_rows["r3-recipe-paths"]["data"]
    assert list(data) == list(MULTI_TURN_PATHS)
    for path, d in data.items():
        assert d["independent"]["routes"] > 400 and d["independent"]["mismatched"] == 0, path
        assert d["replay"]["routes"] > 400 and d["replay"]["mismatched"] == 0, path
        assert d["native"]["mismatched"] > 0, path
    assert tool_rows["r3-same-weights"]["data"]["replay"]["mismatched"] == 0
