"""The learned drafter in the simulator (recipe/sim/draft_head.py, recipe/sim/learned.py): the head's forwards are
charged, its depth follows the roofline by batch size, the online head holds its acceptance while the frozen one
drifts, and its training time is charged."""
import dataclasses

import numpy as np
import pytest

from recipe.sim import learned as L
from recipe.sim.draft_head import (CHAT_HEAD, MATH_HEAD, ChainAcceptance, DraftHead, Drift, LearnedSpeculation,
                                   Training, best_depth, schedule)
from recipe.sim.speculation import KV_BYTES, SpecCost

SMALL = ["--prompts", "64", "--n", "4", "--epochs", "2", "--batch-size", "16"]


def test_the_heads_shape_gives_its_parameters_and_memory():
    h = DraftHead()
    fc, qkv, o, mlp, lm = 3 * 2048 * 2048, 2 * 2048 * (4096 + 1024), 4096 * 2048, 3 * 2048 * 6144, 2048 * 32000
    assert h.params == fc + qkv + o + mlp + lm
    assert h.kv_bytes_per_token == 2048 and h.weight_bytes == 2 * h.params
    kept = h.kv_tokens(1_000_000)
    assert kept == (1_000_000 * KV_BYTES - h.weight_bytes) // (KV_BYTES + 2048) and kept < 1_000_000


def test_chain_acceptance_is_the_eagle_chain_model():
    acc = ChainAcceptance((0.8, 0.5), "t")
    assert acc.tau(0) == 1.0 and acc.tau(1) == pytest.approx(1.8)
    assert acc.tau(2) == pytest.approx(1 + 0.8 + 0.4)
    assert acc.tau(3) == pytest.approx(1 + 0.8 + 0.4 + 0.4 * 0.5 * 0.625)  # the last ratio (0.625) continues
    assert MATH_HEAD.tau(3) == pytest.approx(3.465, abs=1e-6)
    assert CHAT_HEAD.tau(3) == pytest.approx(1 + 0.714 + 0.714 * 0.427 + 0.714 * 0.427 * 0.257)
    both = ChainAcceptance.best_of(MATH_HEAD, CHAT_HEAD, "x")
    assert both.tau(3) >= max(MATH_HEAD.tau(3), CHAT_HEAD.tau(3))


def test_depth_is_deeper_where_the_step_is_memory_bound():
    """With a compute roof that large batches hit, the schedule drafts deeper in the tail (small batch)."""
    cost = SpecCost(bandwidth=2.8e12, flops=6e13, sync_penalty=0.0)
    d = best_depth(cost, DraftHead(), MATH_HEAD, np.arange(1, 257), 4096, k_max=8)
    assert d[0] == 8 and d[-1] < d[0] and (np.diff(d) <= 0).all()


def test_on_the_moe_roofline_a_small_batch_pays_for_each_tokens_experts():
    """Qwen3-30B-A3B at batch 1: every verified token loads new experts, so a head whose later drafts are rarely
    accepted drafts shallower there than at full batch (where all experts are read anyway): MoESD's effect."""
    cost = SpecCost.for_gpu("h100", sync_penalty=0.0)
    d = best_depth(cost, DraftHead(), CHAT_HEAD, np.arange(1, 257), 4096, k_max=8)
    assert d[1] < d[-1]


def test_the_schedule_is_what_vllm_takes():
    assert schedule([3, 3, 2, 2, 0]) == [[1, 2, 3], [3, 4, 2], [5, 5, 0]]
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    depths = [4, 4, 3, 2, 2, 1]
    dense = utils.build_dynamic_sd_schedule_lookup(schedule(depths), 8, max(depths))
    assert dense[1:] == depths + [1, 1]


def test_the_draft_forward_is_charged():
    cost, head = SpecCost.for_gpu("h100", sync_penalty=0.0), DraftHead()
    spec = LearnedSpeculation(cost, head, MATH_HEAD, (3,))
    r, ctx = np.array([1.0, 64.0]), np.array([4096.0, 4096.0])
    tau = MATH_HEAD.tau(3)
    want = (cost.step_time(r, 3, ctx) + head.draft_time(cost, r, 3, ctx, tau)) / (tau * cost.step_time(r, 0, ctx))
    np.testing.assert_allclose(spec.factor(r, ctx), want)
    assert (head.draft_time(cost, r, 3, ctx, tau) > 0).all()
    slow = LearnedSpeculation(cost, dataclasses.replace(head, t0=1e-3), MATH_HEAD, (3,))
    assert (slow.factor(r, ctx) > spec.factor(r, ctx)).all()


def _model(half_life=2.0, training=Training()):
    return L.Model("h100", DraftHead(), Drift(half_life=half_life), training, 256 + 4096, 256)


def _setups():
    return [L.setup(SMALL, 0)]


def test_the_online_head_beats_the_frozen_one_after_drift():
    model, setups = _model(), _setups()
    frozen = L.Drafter("f", MATH_HEAD, online=False)
    online = L.Drafter("o", MATH_HEAD, online=True)
    assert online.acceptance(6, model.drift).tau(3) > frozen.acceptance(6, model.drift).tau(3)
    f, o = L.learned_run(model, setups, frozen), L.learned_run(model, setups, online)
    assert f["tau_last"] < f["tau_first"] and o["tau_last"] > f["tau_last"]
    assert o["speedup"] > f["speedup"]


def test_training_time_charged_lowers_the_speedup():
    setups, online = _setups(), L.Drafter("o", MATH_HEAD, online=True)
    cheap = L.learned_run(_model(), setups, online)
    dear = L.learned_run(_model(training=Training(mfu=1e-4)), setups, online)
    assert dear["train_s_per_step"] > cheap["train_s_per_step"] > 0
    assert dear["speedup"] < cheap["speedup"]


def test_leaving_the_draft_out_would_claim_more():
    model, s = _model(), _setups()[0]
    online = L.Drafter("o", MATH_HEAD, online=True)
    charged = L.measure(s, model.executor(s, online))["speedup"]
    free = L.measure(s, model.executor(s, online, charge_draft=False))["speedup"]
    assert free > charged


def test_the_side_by_side_names_every_source(capsys):
    assert L.main([*SMALL, "--seeds", "0", "--no-needed"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert [r.split(" | ")[0].split(" (")[0] for r in rows] == [
        "| group", "| eagle3 frozen", "| eagle3 online", "| eagle3 online", "| eagle3 online"]
    assert L.GROUP_FILE in rows[0] and all("published" in r for r in rows[1:]) and "upper bound" in rows[-1]
    assert "(chosen)" in out


def test_bad_input_names_the_variable():
    with pytest.raises(ValueError, match="half_life"):
        Drift(half_life=0)
    with pytest.raises(SystemExit, match="--k-max"):
        L.main([*SMALL, "--seeds", "0", "--k-max", "0"])


def test_schedule_flag_prints_vllms_keys(capsys):
    """One depth for every batch size needs no schedule (it would cost vLLM's FULL CUDA graphs); otherwise the
    ranges start at 1 and num_speculative_tokens is their deepest K (vLLM caps K at it)."""
    import json

    assert L.main(["--schedule"]) == 0
    assert json.loads(capsys.readouterr().out) == {"num_speculative_tokens": 3,
                                                   "num_speculative_tokens_per_batch_size": None}
    assert L.main(["--schedule", "--head-tau", "2.1", "--k-max", "8"]) == 0
    got = json.loads(capsys.readouterr().out)
    sched = got["num_speculative_tokens_per_batch_size"]
    assert sched[0][0] == 1 and sched[-1][1] == 256 and got["num_speculative_tokens"] == max(k for *_, k in sched)


def test_drift_never_lifts_a_head_above_its_own_acceptance():
    weak = ChainAcceptance.flat(2.04, 3, "weak")  # below the chat-data head's ~2.10 at k=3
    drift = Drift(half_life=5.0)
    assert drift.at(weak, 50).tau(3) <= weak.tau(3) + 1e-12
    assert drift.at(MATH_HEAD, 50).tau(3) < drift.at(MATH_HEAD, 1).tau(3) < MATH_HEAD.tau(3)
