"""Trace generator calibration, shapes, and the recorded-trace round trip."""
import json

import numpy as np
import pytest

from recipe.sim import trace as T
from recipe.sim.engine import EngineParams
from recipe.sim.run import run_policy

SMALL = dict(num_prompts=128, n=8, epochs=3)


def test_reference_calibration_hits_public_numbers():
    log_scale, sigma = T.calibrate(T.TraceParams())
    off = T._marginal_log_offsets(T.TraceParams(), sigma)
    clipped = T._clipped(T.TraceParams(), log_scale, off)
    assert clipped.mean() == pytest.approx(5916, rel=1e-3)
    assert (clipped >= 16384).mean() == pytest.approx(0.04, abs=1e-3)
    tr = T.generate("reference", num_prompts=4096, epochs=2)
    s = tr.summary()
    assert 5500 < s["mean_length_per_epoch"][0] < 6300  # sampling noise of 4096 prompts
    assert 0.03 <= s["truncated_fraction_per_epoch"][0] <= 0.05
    assert s["mean_length_per_epoch"][1] > s["mean_length_per_epoch"][0]  # drift > 1


def test_shapes_and_determinism():
    a, b = T.generate("heavy_tail", seed=3, **SMALL), T.generate("heavy_tail", seed=3, **SMALL)
    assert np.array_equal(a.lengths, b.lengths)
    assert not np.array_equal(a.lengths, T.generate("heavy_tail", seed=4, **SMALL).lengths)
    bi = T.generate("bimodal", num_prompts=2048, n=8, epochs=1)
    x = np.log(np.median(bi.lengths[0], axis=1))
    half = np.log(bi.params["mode_ratio"]) / 2  # the modes sit about +-half around the centre
    near_centre = np.mean(np.abs(x - np.median(x)) < 0.25)
    near_modes = np.mean(np.abs(np.abs(x - np.median(x)) - half) < 0.25) / 2
    assert near_modes > 2 * near_centre  # two modes, not one bump in the middle
    assert a.lengths.min() >= 1 and a.lengths.max() <= a.response_length
    with pytest.raises(ValueError):
        T.generate("nope")


def test_epoch_noise_makes_last_epoch_an_imperfect_estimate():
    tr = T.generate("reference", num_prompts=1024, n=16, epochs=2)
    m0, m1 = np.log(tr.lengths[0].mean(1)), np.log(tr.lengths[1].mean(1))
    r = np.corrcoef(m0, m1)[0, 1]
    assert 0.6 < r < 0.98


def test_retries_draw_fresh_samples_of_the_same_prompt():
    tr = T.generate("reference", **SMALL)
    rows = np.arange(20)
    first = tr.attempt_lengths(1, rows, np.zeros(20, np.int64))
    again = tr.attempt_lengths(1, rows, np.ones(20, np.int64))
    assert np.array_equal(first, tr.lengths[1, rows]) and not np.array_equal(first, again)
    assert np.corrcoef(np.log(first.mean(1)), np.log(again.mean(1)))[0, 1] > 0.5


@pytest.mark.parametrize("policy", ["baseline", "seed", "oversample-restart"])
def test_recorded_round_trip(tmp_path, policy):
    tr = T.generate("reference", **SMALL)
    path = tmp_path / f"{policy}.jsonl"
    run = run_policy(tr, policy, EngineParams(), batch_size=16, record_path=str(path))
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) >= {"epoch", "step", "cap", "response_length", "gen_time_s", "rows", "sample_index", "lengths",
                          "finish", "predicted"}
    back = T.load_recorded(path)
    assert back.lengths.shape == tr.lengths.shape and np.array_equal(back.row_ids, np.arange(128))
    assert back.params["dropped_epochs"] == []
    if policy == "baseline":
        assert np.array_equal(back.lengths, tr.lengths) and not back.censored.any()
    elif policy == "seed":
        caps = [s.caps[0] for s in run.steps if s.caps[0] > 0]
        assert caps, "the seed cap should bind at least once on this trace"
        assert np.array_equal(back.lengths[~back.censored], tr.lengths[~back.censored])
        assert (back.lengths[back.censored] < tr.lengths[back.censored]).all()
        pess = T.load_recorded(path, censored_as="response_length")
        assert (pess.lengths[pess.censored] == tr.response_length).all()
    else:  # every row completed a group in every epoch: nothing censored, lengths from the kept attempt
        assert not back.censored.any()
    recs = T.engine_records(path)
    assert len(recs) == len(run.steps) and all(r["time_s"] > 0 for r in recs)


def test_recorded_partial_epoch_is_dropped_and_limits_checked(tmp_path):
    tr = T.generate("reference", **SMALL)
    path = tmp_path / "t.jsonl"
    run_policy(tr, "baseline", EngineParams(), batch_size=16, record_path=str(path))
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # the last epoch misses one step
    back = T.load_recorded(path)
    assert back.epochs == 2 and back.params["dropped_epochs"] == [2]
    with pytest.raises(ValueError):
        back.with_response_length(back.response_length + 1)
    assert back.with_response_length(8192).lengths.max() == 8192


def test_recorded_rules_by_hand(tmp_path):
    from recipe.traces import LengthTraceWriter

    path = tmp_path / "hand.jsonl"
    with LengthTraceWriter(path) as w:
        # step 1: row 7 complete (one response cut by the cap); row 9 aborted mid-way (over-sample)
        w.append(epoch=0, step=1, cap=50, response_length=100, gen_time_s=1.0, rows=[7, 7, 9, 9],
                 sample_index=[0, 1, 0, 1], lengths=[50, 20, 30, 10], aborted=[False, False, True, False])
        # step 2: row 9 retried and complete, one response at the limit
        w.append(epoch=0, step=2, cap=None, response_length=100, gen_time_s=1.0, rows=[9, 9],
                 sample_index=[0, 1], lengths=[100, 40])
    tr = T.load_recorded(path)
    assert tr.row_ids.tolist() == [7, 9] and tr.lengths[0].tolist() == [[50, 20], [100, 40]]
    assert tr.censored[0].tolist() == [[True, False], [False, False]]
    assert tr.truncated[0].tolist() == [[False, False], [True, False]]
    assert T.load_recorded(path, censored_as="response_length").lengths[0, 0].tolist() == [100, 20]


def test_previous_run_shares_the_prompt_levels_but_no_responses(tmp_path):
    tr = T.generate("reference", num_prompts=512, n=8, epochs=3, seed=4)
    prev = tr.previous_run()
    assert prev.lengths.shape == tr.lengths.shape and np.array_equal(prev.row_ids, tr.row_ids)
    assert np.array_equal(prev.lengths, tr.previous_run().lengths)  # seeded
    assert not np.array_equal(prev.lengths, T.generate("reference", num_prompts=512, n=8, epochs=3,
                                                       seed=5).previous_run().lengths)
    for e in range(tr.epochs):  # never the replayed draws
        assert (prev.lengths[0] == tr.lengths[e]).mean() < 0.05
    assert np.array_equal(prev.level[0], tr.level[0])  # same base model: same prompt levels in epoch 0
    assert not np.allclose(prev.level[2], tr.level[2])  # then each run drifts its own way
    m = lambda x: np.log(x.mean(axis=1))  # noqa: E731
    assert np.corrcoef(m(prev.lengths[0]), m(tr.lengths[0]))[0, 1] > 0.85
    assert prev.epochs == 3 and tr.previous_run(epochs=1).epochs == 1
    path = tmp_path / "t.jsonl"
    run_policy(tr.subset(prompts=32, epochs=1), "baseline", EngineParams(), batch_size=16, record_path=str(path))
    with pytest.raises(ValueError, match="warm-start"):
        T.load_recorded(path).previous_run()
