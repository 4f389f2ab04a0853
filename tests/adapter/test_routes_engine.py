"""Routing replay (R3) through the recipe's single-turn agent loop on the real vLLM CPU engine: every trained token
of a capped, cut, resumed or handed-back response carries the experts the model routes it to, row for row.

The responses are recorded by ``recipe.route_record.paths`` (the session engine captures routes; the server stand-in
returns them as verl's does with ``enable_rollout_routing_replay``) and compared with a transformers forward of the
same model on prompt + response: the routes Megatron replays must be the model's routing of exactly these tokens.
Megatron-Core replays the same paths in ``tests/megatron/test_router_replay.py``.
"""
import numpy as np
import pytest
import torch

from recipe.route_record.paths import CAP_TOKENS, MULTI_TURN_PATHS, PATHS, model_routes

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def records(route_records, tiny_artifacts):
    """The single-turn paths, and the model's own routing of each."""
    from transformers import AutoModelForCausalLM

    recs = {r.path: r for r in route_records}
    model = AutoModelForCausalLM.from_pretrained(tiny_artifacts.model_dir, dtype=torch.float32).eval()
    return recs, {path: model_routes(model, r.prompt + r.response)[0] for path, r in recs.items()}


def trained_rows(r) -> int:
    """Rows every trained token's log-prob depends on: up to the one that predicts the last trained token."""
    last = max(j for j, m in enumerate(r.mask) if m)
    return len(r.prompt) + last


def test_each_path_took_its_course(records):
    recs, _ = records
    assert list(recs) == list(PATHS)
    assert len(recs["capped"].response) == CAP_TOKENS
    cut = recs["cut"]
    assert 0 < len(cut.response) < 64, "the abort cut the forced response mid-way"
    resumed, finished = recs["resumed"], recs["finished"]
    assert resumed.response[:CAP_TOKENS] == recs["capped"].response and len(resumed.response) > CAP_TOKENS
    assert finished.response == recs["capped"].response  # handed back as stored
    assert finished.requests == 1  # its routes: one prefill, nothing generated into the response
    assert [r.requests for r in recs.values()] == [1, 1, 1, 1]


def test_every_trained_token_carries_the_models_routes(records):
    recs, reference = records
    for path, r in recs.items():
        n = trained_rows(r)
        assert r.routes is not None and len(r.routes) >= n, f"{path}: {len(r.routes)} route rows for {n} needed"
        assert sum(r.mask) == len(r.response), f"{path}: no token left the loss"
        mine = np.sort(r.routes[:n].astype(np.int64), axis=-1)
        wrong = (mine != reference[path][:n]).any(-1)
        print(f"{path}: {wrong.size} (token, layer) routes, {int(wrong.sum())} differ")
        assert not wrong.any(), f"{path}: {int(wrong.sum())} of {wrong.size} routes differ"


def test_a_one_token_shift_would_be_caught(records):
    recs, reference = records
    for path, r in recs.items():
        n = trained_rows(r)
        mine = np.sort(r.routes[:n].astype(np.int64), axis=-1)
        for shifted, ref in ((mine[1:], reference[path][:n - 1]), (mine[:-1], reference[path][1:n])):
            assert (shifted != ref).any(-1).mean() > 0.25, path


@pytest.fixture(scope="module")
def tool_records(tool_route_records):
    """The multi-turn paths on the trained tiny model, and its own routing of each."""
    from transformers import AutoModelForCausalLM

    model_dir, records = tool_route_records
    recs = {r.path: r for r in records}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return recs, {path: model_routes(model, r.prompt + r.response)[0] for path, r in recs.items()}


@pytest.mark.trained_model
def test_multi_turn_routes_cover_tool_replies_and_every_trained_token(tool_records):
    """verl's loop keeps the last turn's routes: the recipe's client hands it the earlier turns' rows plus those the
    last turn's prefill returned (its new tokens, tool replies included: ``routed_experts_prompt_start``), so every
    trained token of every turn is routed as the model routes it; a trajectory handed back from the store gets the
    same routes from one prefill."""
    recs, reference = tool_records
    assert list(recs) == list(MULTI_TURN_PATHS)
    turns, back = recs.values()
    assert back.response == turns.response and back.mask == turns.mask and back.requests == 1
    first_reply = turns.mask.index(0)
    for path, r in recs.items():
        n = trained_rows(r)
        assert n > len(r.prompt) + first_reply  # the rows compared reach past a tool reply into a later turn
        mine = np.sort(r.routes[:n].astype(np.int64), axis=-1)
        wrong = (mine != reference[path][:n]).any(-1)
        print(f"{path}: {wrong.size} (token, layer) routes over {r.mask.count(0)} tool-reply tokens, "
              f"{int(wrong.sum())} differ")
        assert not wrong.any(), f"{path}: {int(wrong.sum())} of {wrong.size} routes differ"
        assert (np.sort(r.routes[1:n].astype(np.int64), axis=-1) != reference[path][:n - 1]).any(-1).mean() > 0.25


class _Returned:
    """A server client that keeps what the engine returned for each request: its sampling params and route rows."""

    def __init__(self, inner):
        self.inner, self.requests = inner, []

    async def generate(self, request_id, **kw):
        out = await self.inner.generate(request_id, **kw)
        self.requests.append((dict(kw["sampling_params"]), len(kw["prompt_ids"]), out))
        return out


def test_a_later_turn_returns_only_its_new_tokens_routes_and_held_plus_new_are_the_models(vllm_engine,
                                                                                         tiny_artifacts):
    """``recipe.adapter.routes.NewRoutesOnly`` on the real engine: the second turn's prompt (the first turn, a tool
    reply) asks vLLM to skip the rows the first turn returned (``routed_experts_prompt_start``); vLLM returns only
    the new tokens' rows, and the held rows plus those are the model's own routing of the whole conversation (a
    transformers forward), row for row."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.adapter.routes import PROMPT_START, NewRoutesOnly
    from recipe.route_record.engine import EngineServerManager

    tokenizer = AutoTokenizer.from_pretrained(tiny_artifacts.model_dir)
    server = _Returned(EngineServerManager(vllm_engine, prompt_length=256, response_length=64, routing_replay=True))
    client = NewRoutesOnly(server)
    params = {"temperature": 1.0, "max_tokens": 6, "ignore_eos": True}

    async def go():
        context = tokenizer.encode("What is twelve times seven, plus three?", add_special_tokens=False)
        first = await client.generate("t", prompt_ids=list(context), sampling_params=dict(params))
        context += list(first.token_ids) + tokenizer.encode(" tool says 87.", add_special_tokens=False)
        second = await client.generate("t", prompt_ids=list(context), sampling_params=dict(params))
        return first, second, context + list(second.token_ids)

    first, second, ids = vllm_engine.run(go(), timeout=300)
    (asked1, prompt1, _), (asked2, prompt2, raw2) = server.requests
    held = prompt1 + len(first.token_ids) - 1
    assert PROMPT_START not in asked1 and asked2[PROMPT_START] == held
    assert len(raw2.routed_experts) == prompt2 + len(second.token_ids) - 1 - held  # only the new tokens' rows
    model = AutoModelForCausalLM.from_pretrained(tiny_artifacts.model_dir, dtype=torch.float32).eval()
    reference = model_routes(model, ids)[0][: len(ids) - 1]
    mine = np.sort(second.routed_experts.astype(np.int64), axis=-1)
    assert mine.shape == reference.shape
    wrong = (mine != reference).any(-1)
    assert not wrong.any(), f"{int(wrong.sum())} of {wrong.size} routes differ"
