"""R3 end to end on the CPU: vLLM CPU records each token's routed experts and log-prob, Megatron-Core replays them
through verl's router-replay code (``python -m recipe.megatron_check replay``, :mod:`recipe.megatron_check.replay`
has the measured numbers).

The engine runs here; the Megatron check in a subprocess (Megatron's process groups are global to a process) reads
the recorded sequences from an ``.npz`` file and writes its rows as JSON, which the tests assert on. ~75 s on 2 cores.
"""
import json
import sys

import numpy as np
import pytest

from recipe.testing.megatron_site import run_with_megatron

pytestmark = [pytest.mark.megatron, pytest.mark.engine, pytest.mark.slow]
_rng = np.random.default_rng(1)
PROMPTS = [[int(t) for t in _rng.integers(3, 900, n)] for n in (7, 23, 41)]
LENGTHS = [32, 24, 40]


def record(model_dir, path) -> None:
    """Sample the responses on vLLM CPU (temperature 1) with routes and the sampled tokens' log-probs; save them."""
    from recipe.megatron_check.replay import save_rollouts
    from recipe.testing.vllm_engine import InProcessVLLM

    engine = InProcessVLLM(model_dir, max_model_len=512, max_num_seqs=8, seed=0, enable_return_routed_experts=True,
                           gpu_memory_utilization=0.06)  # a small KV cache: the suite's e2e runs hold memory beside it
    try:
        outputs = engine.run(engine.generate_forced(PROMPTS, LENGTHS, temperature=1.0, logprobs=0))
    finally:
        engine.shutdown()
    save_rollouts(path, outputs)


@pytest.fixture(scope="module")
def rows(tmp_path_factory, tiny_artifacts):
    work = tmp_path_factory.mktemp("router-replay")
    record(tiny_artifacts.model_dir, work / "rollouts.npz")
    run_with_megatron([sys.executable, "-m", "recipe.megatron_check", "replay", "--cpu", "--work", str(work / "run"),
                       "--model", str(tiny_artifacts.model_dir), "--rollouts", str(work / "rollouts.npz"),
                       "--json", str(work / "rows.json")], work / "replay.log")
    return {r["step"]: r for r in json.loads((work / "rows.json").read_text())}


def test_every_step_ran_and_passed(rows):
    assert list(rows) == ["environment", "r3-same-weights", "r3-shifted-routes-detected", "r3-after-optimizer-step",
                          "r3-megatron-bf16"]
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
    assert bf16["replay"]["logprob_gap"] < bf16["native"]["logprob_gap"]


def test_a_one_token_shift_of_the_routes_is_caught(rows):
    data = rows["r3-shifted-routes-detected"]["data"]
    assert set(data) == {"by+1", "by-1"}
    for shifted in data.values():
        assert shifted["mismatch_share"] > 0.25
        assert shifted["logprob_gap"] > 100 * rows["r3-same-weights"]["data"]["replay"]["logprob_gap"]
