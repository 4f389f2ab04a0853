"""Multi-turn rollouts in the simulator (recipe/sim/multiturn/): the engine charges the re-prefill after a tool
call, a trajectory is never in the engine while its tool runs, every turn is generated once without restarts,
``continue`` resumes from the last turn boundary without re-running completed tool calls, the time key orders as the
token key when tools take no time, and bench/sim_multiturn.py's section regenerates."""
import functools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recipe.core.ordering import expected_time_key, length_sorted_order
from recipe.sim import multiturn as M
from recipe.sim.engine import EngineParams
from harness.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
# a = 1 s per decode step, prefill 0.01 s per token, 100 prompt tokens, one slot: every number below by hand
HAND = EngineParams(replicas=1, max_num_seqs=1, decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_tok_s=0.01,
                    prompt_len=100, kv_tokens=None)
SMALL = dict(num_prompts=64, n=4, epochs=3)


def _one(turns, p=HAND, **kw):
    seg, lat = M.from_turns(turns)
    return M.simulate_replica(seg.tolist(), lat.tolist(), [0] * len(seg), p, **kw)


def test_the_engine_charges_the_reprefill_of_the_whole_context():
    # prefill 100 (1.0 s), 3 decode steps (3 s) -> t 4; tool 1 s -> 5; re-prefill 100 + 3 + 50 = 153 tokens
    # (1.53 s) -> 6.53; 2 decode steps -> 8.53
    r = _one([[(3, 1.0, 50), (2, 0, 0)]])
    assert r.finish[0] == pytest.approx(8.53) and r.reprefill_tokens == 153 and r.prefill_tokens == 253
    assert r.decoded == [5]
    # the prefix kept through the tool (reprefill="new"): only the 50 tool tokens are prefilled on return (0.5 s) -> 7.5
    new = _one([[(3, 1.0, 50), (2, 0, 0)]], reprefill="new")
    assert new.finish[0] == pytest.approx(7.5) and new.reprefill_tokens == 50
    # the KV-read term sees the context grow: turn 0 at 100, 101, 102 tokens, turn 1 at 153, 154
    p = EngineParams(**{**HAND.to_dict(), "decode_c": 0.001})
    r = _one([[(3, 1.0, 50), (2, 0, 0)]], p)
    assert r.finish[0] == pytest.approx(1.0 + 3 + 0.303 + 1.0 + 1.53 + 2 + 0.307)


def test_a_tool_call_frees_the_slot():
    # one slot: A decodes 3 (t 1..4) and leaves for a 10 s tool; B is admitted at 4 (prefill 1 s, 4 steps) and ends
    # at 9, while A's tool runs; A comes back at 14, re-prefills 153 tokens and ends at 17.53
    r = _one([[(3, 10.0, 50), (2, 0, 0)], [(4, 0, 0)]])
    assert r.finish == pytest.approx([17.53, 9.0])
    # a tool output that reaches the budget ends the trajectory when the tool returns (truncated, no re-prefill)
    seg, lat = M.from_turns([[(3, 2.0, 50), (2, 0, 0)]], response_length=40)
    assert seg.tolist() == [[3, 37, 0, 0]]
    r = M.simulate_replica(seg.tolist(), lat.tolist(), [0], HAND)
    assert r.finish[0] == pytest.approx(6.0) and r.reprefill_tokens == 0


def test_clip_budget_counts_tool_tokens_and_a_cut_turn_makes_no_call():
    seg = np.array([[5, 3, 4, 2, 6, 0]])
    assert M.clip_budget(seg, 100).tolist() == seg.tolist()
    assert M.clip_budget(seg, 10).tolist() == [[5, 3, 2, 0, 0, 0]]  # turn 1 cut at 2 tokens: no tool call 1
    assert M.clip_budget(seg, 8).tolist() == [[5, 3, 0, 0, 0, 0]]
    assert M.segment_count(M.clip_budget(seg, 10)).tolist() == [3]


def test_never_in_the_engine_while_its_tool_runs():
    tr = M.generate_mt("mt-reference", **SMALL)
    seg = tr.seg[0, :16].reshape(-1, tr.seg.shape[-1])
    lat = tr.lat[0, :16].reshape(-1, tr.lat.shape[-1])
    p = EngineParams(replicas=2, max_num_seqs=8, kv_tokens=None)
    timing = M.simulate_mt_step(seg, lat, np.zeros(len(seg), np.int64), p, [0], log=True)
    checked = 0
    for _, idx, rr in timing.runs:
        decode = [e for e in rr.log if e[0] != "tool"]
        tools = [e for e in rr.log if e[0] == "tool"]
        assert all(len(running) <= p.max_num_seqs for _, _, running in decode)
        for _, j, k, t0, t1 in tools:
            assert t1 > t0
            for s0, s1, running in decode:
                if j in running:
                    assert s1 <= t0 + 1e-9 or s0 >= t1 - 1e-9, (j, k, t0, t1, s0, s1)
                    checked += 1
        # every tool call of every trajectory ran exactly once
        calls = {(j, k) for _, j, k, _, _ in tools}
        assert len(calls) == len(tools) == int((seg[idx][:, 1::2] > 0).sum())
    assert checked > 100 and np.isfinite(timing.finish).all()


@functools.cache
def _details(name: str, seed: int = 0):
    tr = M.generate_mt("mt-reference", seed=seed, **SMALL)
    details: list = []
    run = M.run_mt_policy(tr, name, EngineParams(kv_tokens=None), batch_size=16, seed=seed, details=details)
    return tr, run, details


@pytest.mark.parametrize("name", ["baseline", "order-time", "tailcut-level"])
def test_every_turn_generated_once_without_restarts(name):
    tr, run, details = _details(name)
    for d in details:
        assistant = d.seg[..., 0::2]
        assert (d.pos0 == 0).all() and d.kept.all()
        k = np.arange(assistant.shape[-1])
        done = np.where(2 * k < d.pos[..., None], assistant, 0).sum(axis=-1)  # completed assistant turns
        assert (d.decoded == done + d.partial).all()  # each decoded once, none twice
        if name != "tailcut-level":
            assert (d.decoded == assistant.sum(axis=-1)).all() and not d.stopped.any()
    launched = [(s.epoch, r) for s, d in zip(run.steps, details) for r in d.rows.tolist()]
    assert len(launched) == len(set(launched)) == tr.epochs * 64
    assert sum(s.wasted_tokens for s in run.steps) == 0
    if name == "tailcut-level":
        assert any(d.stopped.any() for d in details)


def test_continue_resumes_at_the_turn_boundary_and_never_reruns_a_completed_tool():
    # engine: turns (3 | tool 0: 1 s, 5 tokens | 3 | tool 1: 4 s, 5 tokens | 2)
    turns = [[(3, 1.0, 5), (3, 4.0, 5), (2, 0, 0)]]
    full = _one(turns, log=True)
    # 1 + 3 -> 4; tool to 5; prefill 108 -> 6.08; decode 3 -> 9.08; tool to 13.08; prefill 116 -> 14.24; 2 -> 16.24
    assert full.finish[0] == pytest.approx(16.24)
    mid_tool = _one(turns, stop=10.0)
    assert mid_tool.pos == [3] and mid_tool.partial == [0]  # turn 1 done, tool 1 in flight: boundary 3
    mid_turn = _one(turns, stop=7.5)
    assert mid_turn.pos == [2] and mid_turn.partial == [1]  # in turn 1 (1 token of 3): boundary 2, tool 0 done
    seg, lat = M.from_turns(turns)
    # resumed mid-tool: tool 1 issued again (4 s), tool 0 never; then the whole context (116 tokens) prefilled
    r = M.simulate_replica(seg.tolist(), lat.tolist(), [3], HAND, log=True)
    assert [e[2] for e in r.log if e[0] == "tool"] == [1]
    assert r.finish[0] == pytest.approx(4.0 + 1.16 + 2) and r.decoded == [2]
    # resumed mid-turn: turn 1 from its start after re-prefilling 108 tokens, tool 0 not re-run
    r = M.simulate_replica(seg.tolist(), lat.tolist(), [2], HAND, log=True)
    assert [e[2] for e in r.log if e[0] == "tool"] == [1]
    assert r.finish[0] == pytest.approx(1.08 + 3 + 4 + 1.16 + 2) and r.decoded == [5]
    # the driver: each aborted continue group comes back at that boundary, and nothing before it runs again
    tr, run, details = _details("oversample-continue")
    resumed = 0
    pending = {}
    for d in details:
        for i, r_ in enumerate(d.rows.tolist()):
            if r_ in pending:
                assert (d.pos0[i] == pending.pop(r_)).all()
                resumed += 1
            if d.resumed_from[i, 0] >= 0:
                assert (d.resumed_from[i] == d.pos[i]).all()
                pending[r_] = d.resumed_from[i]
        k = np.arange(d.seg.shape[-1] // 2)
        before = (2 * k + 2)[None, None, :] <= d.pos0[..., None]  # tool k completed before this launch
        assert d.tool_runs.max(initial=0) <= (d.seg[..., 1::2] > 0).sum(axis=-1).max()
        assert (d.tool_runs <= ((d.seg[..., 1::2] > 0) & ~before).sum(axis=-1)).all()
    assert resumed > 10 and sum(s.stale_tokens for s in run.steps) > 0
    assert max(int(s.versions.max()) for s in run.steps) <= 2


def test_time_order_is_the_token_order_without_tool_latency():
    rng = np.random.default_rng(3)
    tokens = rng.integers(100, 16000, 500).astype(float)
    calls = rng.integers(1, 9, 500)
    assert np.array_equal(expected_time_key(tokens, calls, 0.0, 60.0), tokens)
    key = expected_time_key(tokens, calls, 2.0, 50.0)
    assert np.allclose(key, tokens + calls * 100.0)
    a = length_sorted_order(tokens, np.random.default_rng(1), batch_size=32)
    b = length_sorted_order(expected_time_key(tokens, calls, 0.0, 60.0), np.random.default_rng(1), batch_size=32)
    assert np.array_equal(a, b)
    assert np.isnan(expected_time_key([np.nan, 5.0], [1, np.nan], 1.0, 1.0)).all()
    with pytest.raises(ValueError, match="tool_latency_s"):
        expected_time_key(tokens, calls, -1.0, 60.0)
    with pytest.raises(ValueError, match="tokens_per_s"):
        expected_time_key(tokens, calls, 1.0, 0.0)
    # the whole run: with every tool instant, ordering by time is ordering by tokens, step for step
    tr = M.generate_mt("mt-reference", latency="lognormal", latency_lo=0.0, latency_hi=0.0, **SMALL)
    eng = EngineParams(kv_tokens=None)
    runs = [M.run_mt_policy(tr, nm, eng, batch_size=16) for nm in ("order-tokens", "order-time")]
    assert [s.time_s for s in runs[0].steps] == [s.time_s for s in runs[1].steps]
    assert all(np.array_equal(a.trained_rows, b.trained_rows) for a, b in zip(*(r.steps for r in runs)))
    # ... and with tool latency it does not
    tr = M.generate_mt("mt-heldout", **SMALL)
    runs = [M.run_mt_policy(tr, nm, eng, batch_size=16) for nm in ("order-tokens", "order-time")]
    assert any(not np.array_equal(a.trained_rows, b.trained_rows) for a, b in zip(*(r.steps for r in runs)))


def test_harder_prompts_make_more_and_longer_turns_and_shapes_differ():
    tr = M.generate_mt("mt-reference", num_prompts=400, n=8, epochs=1)
    z = tr.z[0]
    calls = tr.calls[0].mean(axis=1)
    turn = tr.seg[0][..., 0::2].sum(axis=-1).mean(axis=1) / (calls + 1)
    assert np.corrcoef(z, calls)[0, 1] > 0.5 and np.corrcoef(z, turn)[0, 1] > 0.5
    assert tr.calls.min() >= 1 and tr.calls.max() <= 8
    live = tr.seg[..., 1::2] > 0
    assert 0.5 <= tr.lat[live].min() and tr.lat[live].max() <= 10.0
    assert (tr.totals <= tr.response_length).all()
    held = M.generate_mt("mt-heldout", num_prompts=400, n=8, epochs=1)
    assert held.calls.max() > 8 and held.lat[held.seg[..., 1::2] > 0].max() > 10.0
    prev = tr.previous_run()
    assert np.array_equal(prev.z[0], tr.z[0]) and not np.array_equal(prev.seg, tr.seg)


def test_policies_summarise_like_the_single_turn_ones():
    tr = M.generate_mt("mt-reference", **SMALL)
    out = {e["name"]: e for e in M.simulate_mt(tr, M.MT_DEFAULT_POLICIES, EngineParams(kv_tokens=None),
                                                batch_size=16)}
    assert set(out) == set(M.MT_DEFAULT_POLICIES)
    assert all(e["every_prompt_once_per_epoch"] for e in out.values())
    assert out["baseline"]["speedup_vs_baseline"] == 1.0 and out["baseline"]["reprefill_per_decoded"] > 0
    for nm in ("baseline", "seed", "tailcut-level", "oversample-restart", "order-tokens", "order-time"):
        assert out[nm]["max_policy_versions"] == 1 and out[nm]["stale_token_fraction"] == 0
    assert out["oversample-restart"]["wasted_tokens_fraction"] > 0
    assert out["oversample-continue"]["max_policy_versions"] == 2
    assert out["tailcut-level"]["truncated_fraction"] > out["order-tokens"]["truncated_fraction"]
    assert all(math.isfinite(e["speedup_vs_baseline"]) for e in out.values())


def test_bench_section_regenerates(tmp_path):
    bench = load_script(ROOT / "bench" / "sim_multiturn.py")
    saved = dict(M.MT_POLICIES)
    try:
        cfg = bench.Config(tuning_seeds=(10,), report_seeds=(0,), restart_ratios=(0.25,), continue_ratios=(1.0,),
                           tokens_per_s=(60.0,), trace=SMALL, batch_size=16)
        text = bench.section(cfg)
    finally:
        M.MT_POLICIES.clear()
        M.MT_POLICIES.update(saved)
    assert bench.COMMAND in text and "| mt-heldout (held out) | over-sample `restart` |" in text
    assert "**chosen**" in text and "Default by this:" in text
    results = tmp_path / "RESULTS.md"
    results.write_text(f"# R\n\nbefore\n\n{bench.MARK_START}\nPREVIOUS-TEXT\n{bench.MARK_END}\n\nafter\n")
    from recipe.report.sections import write_section

    write_section(results, bench.MARK_START, bench.MARK_END, bench.HEADING, text)
    out = results.read_text()
    assert out.startswith("# R\n\nbefore") and out.rstrip().endswith("after") and "PREVIOUS-TEXT" not in out
    assert out.count(bench.MARK_START) == 1 and text in out
    assert bench.MARK_START in (ROOT / "bench" / "RESULTS.md").read_text()  # the checked-in section exists


def test_cli_prints_a_table():
    out = subprocess.run([sys.executable, "-m", "recipe.sim.multiturn", "--shape", "mt-heldout", "--policies",
                          "baseline,tailcut-level", "--trace-param", "num_prompts=64", "--trace-param", "n=4",
                          "--trace-param", "epochs=2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| tailcut-level |" in out.stdout and "mean_tool_calls" in out.stdout
