"""``recipe.adapter.routes.cover_routes`` against a scripted server: when it re-prefills, what it asks for, and what
leaves the loss when routes cannot be had (the engine paths: tests/adapter/test_routes_engine.py)."""
import asyncio
import json

import numpy as np
import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.workers.rollout.replica import TokenOutput

from recipe.adapter.routes import UNROUTED, cover_routes, covered_tokens

LAYERS, TOP_K, EXPERTS = 3, 2, 4


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": LAYERS, "num_experts_per_tok": TOP_K,
                                                      "num_experts": EXPERTS}))
    return str(tmp_path)


class Server:
    def __init__(self, rows=None, stop="completed", routes=True):
        self.rows, self.stop, self.routes, self.calls = rows, stop, routes, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        self.calls.append((list(prompt_ids), dict(sampling_params)))
        n = len(prompt_ids) if self.rows is None else self.rows
        routes = np.arange(n * LAYERS * TOP_K, dtype=np.uint8).reshape(n, LAYERS, TOP_K) if self.routes else None
        return TokenOutput(token_ids=[9], stop_reason=self.stop, routed_experts=routes)


def output(response, mask, routes_rows=None):
    prompt = [1, 2, 3]
    routes = None if routes_rows is None else np.ones((routes_rows, LAYERS, TOP_K), dtype=np.uint8)
    return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=mask, routed_experts=routes,
                           num_turns=2, metrics={}, extra_fields={})


def cover(out, server, model_dir, cut=False):
    asyncio.run(cover_routes(out, server, {"temperature": 1.0, "logprobs": True}, model_dir, cut=cut))


def test_covered_tokens_counts_the_rows_each_log_prob_reads():
    assert covered_tokens(None, 3, 4) == 0
    assert covered_tokens(np.zeros((6, 1, 1)), 3, 4) == 4  # prompt 3 + response 4 - 1: whole
    assert covered_tokens(np.zeros((5, 1, 1)), 3, 4) == 3
    assert covered_tokens(np.zeros((2, 1, 1)), 3, 4) == 0


def test_a_routeless_response_is_re_prefilled_without_its_last_token(model_dir):
    out, server = output([4, 5, 6], [1, 1, 1]), Server()
    cover(out, server, model_dir)
    (prompt, params), = server.calls
    assert prompt == [1, 2, 3, 4, 5] and params["max_tokens"] == 1 and params["logprobs"] is False
    assert params["temperature"] == 1.0
    assert out.routed_experts.shape == (5, LAYERS, TOP_K) and out.response_mask == [1, 1, 1]
    assert UNROUTED not in out.extra_fields


def test_whole_routes_and_untrained_tails_send_nothing(model_dir):
    for out in (output([4, 5, 6], [1, 1, 1], routes_rows=5), output([4, 5, 6], [1, 0, 0], routes_rows=3)):
        server = Server()
        cover(out, server, model_dir)
        assert server.calls == [] and UNROUTED not in out.extra_fields


def test_a_cut_trajectory_sends_nothing_and_drops_unrouted_tokens_from_the_loss(model_dir):
    out, server = output([4, 5, 6, 7], [1, 1, 1, 1], routes_rows=4), Server()
    cover(out, server, model_dir, cut=True)
    assert server.calls == []
    assert out.response_mask == [1, 1, 0, 0] and out.extra_fields[UNROUTED] == 2
    # the rows vLLM returned, then the untrained tail's spread over the experts (prompt 3 + response 4 - 1 rows)
    assert out.routed_experts.shape == (6, LAYERS, TOP_K) and (out.routed_experts[:4] == 1).all()


def test_a_prefill_that_comes_back_short_masks_too(model_dir):
    out = output([4, 5, 6], [1, 1, 1])
    cover(out, Server(rows=2, stop="aborted"), model_dir)
    assert out.response_mask == [0, 0, 0] and out.extra_fields[UNROUTED] == 3
    assert out.routed_experts.shape == (0, LAYERS, TOP_K)


def test_an_empty_response_gets_an_empty_routes_array(model_dir):
    out, server = output([], []), Server()
    cover(out, server, model_dir)
    assert server.calls == [] and out.routed_experts.shape == (0, LAYERS, TOP_K)


def test_a_server_returning_no_routes_at_all_is_an_error_not_a_masked_step(model_dir):
    out = output([4, 5, 6], [1, 1, 1])
    with pytest.raises(RuntimeError, match="enable_rollout_routing_replay=True"):
        cover(out, Server(routes=False), model_dir)
    aborted = output([4, 5, 6], [1, 1, 1])  # the prefill itself aborted: the step is closing, mask instead
    cover(aborted, Server(routes=False, stop="aborted"), model_dir)
    assert aborted.response_mask == [0, 0, 0]


def test_the_uncovered_count_is_of_trained_tokens_not_of_the_tail(model_dir):
    """A cut trajectory whose uncovered part holds a tool reply (mask 0) between trained tokens: only the trained
    ones are counted as having left the loss."""
    out = output([4, 5, 6, 7, 8, 9, 10], [1, 1, 0, 0, 0, 1, 1], routes_rows=4)  # covers the first 2 tokens
    cover(out, Server(), model_dir, cut=True)
    assert out.response_mask == [1, 1, 0, 0, 0, 0, 0] and out.extra_fields[UNROUTED] == 2


def test_a_trajectory_that_trains_nothing_still_carries_a_routes_array(model_dir):
    """Every row of a batch must carry the field (TransferQueue refuses a batch that mixes them): a response whose
    tokens are all outside the loss gets a routes array of no rows, and no prefill."""
    out, server = output([4, 5, 6], [0, 0, 0]), Server()
    cover(out, server, model_dir)
    assert server.calls == [] and out.routed_experts.shape == (0, LAYERS, TOP_K)
    assert out.as_dict()["routed_experts"].shape == (6, LAYERS, TOP_K)


# ------------------------------------------------ the single-turn loop with R3 (over-sample continue, the tail cut)

class LoopServer:
    """verl's server client for the loop: each call returns the next reply (token ids, stop reason) with a log-prob per
    token and, like vLLM, a route row for every forwarded token (prompt + reply - 1; a prefill: its prompt), less the
    last ``missing`` rows (None: no routes, as an abort before the first step returns); records each call's prompt,
    params and keyword arguments."""

    def __init__(self, replies=(), missing=0):
        self.replies, self.calls, self.missing = list(replies), [], missing

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                           "sampling_params": dict(sampling_params), **kw})
        ids, stop = self.replies.pop(0) if self.replies else ([9], "completed")
        ids = ids[: sampling_params.get("max_tokens", len(ids))]
        rows = max(0, len(prompt_ids) + len(ids) - 1 - (self.missing or 0))
        routes = None if self.missing is None else np.ones((rows, LAYERS, TOP_K), dtype=np.uint8)
        self.missing = 0  # a prefill after it returns whole routes
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason=stop, routed_experts=routes,
                           extra_fields={"global_steps": 4, "min_global_steps": 4, "max_global_steps": 4})


STORED = [5, 6, 7]


def replay_loop_config(tiny_artifacts, tmp_path, *overrides):
    from recipe.route_record.config import compose_recipe

    return compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={tmp_path}/run",
                                           "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
                                           *overrides])


CONTINUE = ["recipe.over_sample.enable=1", "recipe.over_sample.requeue=continue"]


def run_single_turn(cfg, server, monkeypatch, complete=None, priority=0):
    """One run of the recipe's single-turn loop; ``complete`` (True/False) resumes session 0 of a stored group whose
    response holds ``STORED``, None runs a fresh row."""
    from transformers import AutoTokenizer

    from recipe.adapter.fields import CAP, PARTIAL
    from recipe.adapter.partial import PartialRef, StoredResponse
    from recipe.route_record.config import build_agent_loop

    async def fetch(ref, session, turns=False):
        return StoredResponse(tokens=list(STORED), logprobs=[-0.25] * len(STORED))

    monkeypatch.setattr("recipe.adapter.agent_loop.fetch_partial", fetch)
    fields = {CAP: 20}
    if complete is not None:
        fields[PARTIAL] = PartialRef(key_prefix="u", partition_id="train", complete=[complete], min_version=2,
                                     resumes=1, has_logprobs=True).to_json()
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)

    async def go():
        loop = build_agent_loop(cfg, server, tokenizer)
        return await loop.run({"logprobs": True, "temperature": 1.0}, raw_prompt=[{"role": "user", "content": "hi"}],
                              session_id=0, priority=priority, **fields)

    return asyncio.run(go())


def test_a_finished_session_whose_stale_tokens_are_masked_costs_no_prefill(tiny_artifacts, tmp_path, monkeypatch):
    """``mask_stale_tokens``: a finished session handed back from the store trains nothing, so its routes are not
    re-prefilled (up to a whole response of prefill for nothing); it still carries the routes field."""
    cfg = replay_loop_config(tiny_artifacts, tmp_path, *CONTINUE, "recipe.over_sample.mask_stale_tokens=true")
    server = LoopServer()
    out = run_single_turn(cfg, server, monkeypatch, complete=True)
    assert out.response_ids == STORED and out.response_mask == [0, 0, 0]
    assert server.calls == []
    assert out.routed_experts is not None and out.as_dict()["routed_experts"].shape[0] == len(out.prompt_ids) + 3


def test_a_response_cut_by_over_sampling_keeps_its_mask_and_holds_no_routes(tiny_artifacts, tmp_path, monkeypatch):
    """Over-sampling's abort cut it: its group lost the race and is not trained this step. Its mask stays whole (a
    resume restores it) and no routes wait in TransferQueue with it (the resume routes it anew)."""
    cfg = replay_loop_config(tiny_artifacts, tmp_path, *CONTINUE)
    out = run_single_turn(cfg, LoopServer([([], "aborted")], missing=None), monkeypatch, complete=False)
    assert out.response_ids == STORED and out.response_mask == [1, 1, 1]
    assert out.routed_experts is None and UNROUTED not in out.extra_fields


def test_a_response_cut_by_the_tail_cut_is_trained_with_its_unrouted_tokens_masked(tiny_artifacts, tmp_path,
                                                                                   monkeypatch):
    """The tail cut trains what it cuts: tokens past the routes vLLM returned leave the loss, and are counted."""
    cfg = replay_loop_config(tiny_artifacts, tmp_path, "recipe.tail_cut.enable=1")
    # the abort came before the last tokens' routes were recorded
    out = run_single_turn(cfg, LoopServer([([4, 5, 6, 7], "aborted")], missing=2), monkeypatch)
    assert out.response_mask == [1, 1, 0, 0] and out.extra_fields[UNROUTED] == 2
    assert out.routed_experts is not None


def test_a_re_prefill_queues_at_the_rows_priority_under_its_request_id(tiny_artifacts, tmp_path, monkeypatch):
    """A finished session's routes under ``ROLLOUT_SCHEDULING_POLICY=priority``: the prefill carries the row's
    priority (a resumed group's runs first) and the trajectory's request id (verl's, ``det-<priority>`` under
    ``full_determinism``), marked with its group's prompt for the group-affinity router."""
    from recipe.adapter.router import group_prompt, group_request_id

    cfg = replay_loop_config(tiny_artifacts, tmp_path, *CONTINUE, "actor_rollout_ref.rollout.full_determinism=True")
    server = LoopServer()
    out = run_single_turn(cfg, server, monkeypatch, complete=True, priority=-(2**30))
    (call,) = server.calls
    assert call["priority"] == -(2**30)
    assert call["request_id"] == group_request_id(f"det-{-(2**30)}", len(out.prompt_ids))
    assert group_prompt(call["request_id"], call["prompt_ids"]) == out.prompt_ids
    assert call["prompt_ids"] == out.prompt_ids + STORED[:-1] and out.response_mask == [1, 1, 1]


def test_a_re_prefill_aborted_by_over_sampling_leaves_the_session_as_it_was(tiny_artifacts, tmp_path, monkeypatch):
    """A finished session's routes prefill is aborted: the step is closing on its group, which is not trained. Its
    mask stays whole (a later resume hands it back again) and it holds no routes."""
    cfg = replay_loop_config(tiny_artifacts, tmp_path, *CONTINUE)
    server = LoopServer([([], "aborted")], missing=None)
    out = run_single_turn(cfg, server, monkeypatch, complete=True)
    assert len(server.calls) == 1 and server.calls[0]["sampling_params"]["max_tokens"] == 1  # the prefill
    assert out.response_mask == [1, 1, 1] and out.routed_experts is None and UNROUTED not in out.extra_fields


# ------------------------------------------ what R3 refuses to replay, and the rows no trained token depends on

class Replies:
    """A server client whose every reply generated ``tokens`` and carries ``routes`` (a fake capture)."""

    def __init__(self, routes, tokens=(9,), stop="completed"):
        self.routes, self.tokens, self.stop, self.calls = routes, list(tokens), stop, 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        self.calls += 1
        return TokenOutput(token_ids=self.tokens, stop_reason=self.stop, routed_experts=self.routes)


def test_routes_vllm_never_captured_are_an_error_naming_the_kernel_and_the_fix(model_dir):
    """A MoE kernel that selects its experts inside itself (FlashInfer's TRT-LLM bf16 MoE, vLLM 0.24's pick on
    Blackwell) never calls the router that captures: vLLM returns its zero-filled buffer, which R3 would replay as
    expert 0 for every token. Caught on a turn's reply (the loops' client) and on a routes prefill."""
    from recipe.adapter.routes import StopRecorder

    zeros = np.zeros((7, LAYERS, TOP_K), dtype=np.uint8)
    turn = StopRecorder(Replies(zeros, tokens=[7, 8, 9]))
    with pytest.raises(RuntimeError, match=r"expert 0 for every token of 3 of 3 MoE layers \(\[0, 1, 2\]\) of a "
                                           r"request that generated 3 token\(s\).*TRT-LLM.*SM100.*"
                                           r"engine_kwargs\.vllm\.moe_backend=triton"):
        asyncio.run(turn.generate("r", prompt_ids=[1, 2, 3, 4, 5], sampling_params={}))
    one_layer = np.ones((5, LAYERS, TOP_K), dtype=np.uint8)
    one_layer[:, 1] = 0  # one MoE layer (a different quant method) skipped the router
    with pytest.raises(RuntimeError, match=r"1 of 3 MoE layers \(\[1\]\)"):
        cover(output([4, 5, 6], [1, 1, 1]), Replies(one_layer), model_dir)


def test_expert_0_where_a_routing_can_choose_it_is_not_mistaken_for_a_missed_capture(model_dir):
    from recipe.adapter.routes import StopRecorder, uncaptured_layers

    routes = np.zeros((5, LAYERS, TOP_K), dtype=np.uint8)
    routes[..., 1] = 3  # every token to experts 0 and 3: a routing
    out = output([4, 5, 6], [1, 1, 1])
    cover(out, Replies(routes), model_dir)
    assert out.routed_experts.shape == (5, LAYERS, TOP_K)
    assert uncaptured_layers(np.zeros((31, 2, 1))) == []  # top_k 1: 31 rows of expert 0 can be a routing
    assert uncaptured_layers(np.zeros((32, 2, 1))) == [0, 1]
    aborted = StopRecorder(Replies(np.zeros((3, LAYERS, TOP_K), np.uint8), tokens=[], stop="aborted"))
    assert asyncio.run(aborted.generate("r", prompt_ids=[1, 2, 3], sampling_params={})).stop_reason == "aborted"


@pytest.mark.parametrize("untrained", [False, True])
def test_a_finished_prefill_with_too_few_rows_is_an_error_not_an_untrained_trajectory(model_dir, untrained):
    """Only an abort may cut a routes prefill short (that case: test_a_prefill_that_comes_back_short_masks_too). A
    finished one with fewer rows than its prompt is an engine fault; masking the tokens, or (over-sampling) leaving
    the trajectory untrained, would hide it."""
    out = output([4, 5, 6], [1, 1, 1])
    with pytest.raises(RuntimeError, match=r"routes prefill of 5 tokens finished \(completed\) with 2 route rows, "
                                           r"5 expected"):
        asyncio.run(cover_routes(out, Server(rows=2), {"temperature": 1.0}, model_dir, cut=False,
                                 aborted_is_untrained=untrained))


def test_rows_after_the_last_trained_token_are_spread_over_the_experts_not_replayed_as_expert_0(model_dir):
    """A trajectory ending in a tool reply (mask 0) has routes up to its last trained token. verl pads the rest with
    zeros and Megatron replays every row of a trained sequence but its last (build_r3_replay_mask): the tail's
    experts change no trained log-prob, but all on expert 0 they are one expert's load."""
    out, server = output([4, 5, 6, 7, 8, 9], [1, 1, 0, 0, 0, 0], routes_rows=4), Server()
    cover(out, server, model_dir)
    assert server.calls == []  # the tail trains nothing: no prefill for it
    routes = out.as_dict()["routed_experts"].numpy()  # what verl's worker stores: prompt + response rows
    assert routes.shape == (9, LAYERS, TOP_K) and (routes[:4] == 1).all()
    tail = routes[4:8]  # replayed: every row but the last
    assert (tail[..., 0] != tail[..., 1]).all()  # top_k distinct experts a row, as a routing has
    for layer in range(LAYERS):  # 4 rows x 2 slots over 4 experts: each expert twice
        assert np.bincount(tail[:, layer].ravel(), minlength=EXPERTS).tolist() == [2] * EXPERTS
    untrained = output([4, 5, 6], [0, 0, 0], routes_rows=2)  # replays nothing: no rows added
    cover(untrained, server, model_dir)
    assert untrained.routed_experts.shape == (2, LAYERS, TOP_K)


# ------------------------------------------ multi-turn: each turn asks only for its new tokens' routes

def routes_of(ids):
    """A fake capture: the row of a token depends on the token (enough to see rows in the wrong place)."""
    ids = np.asarray(ids, dtype=np.int64)
    return ((ids[:, None, None] * 7 + np.arange(LAYERS)[None, :, None] * 3 + np.arange(TOP_K)) % 200).astype(np.uint8)


class Turns:
    """vLLM with ``enable_return_routed_experts``: a row for each forwarded token (prompt + reply - 1), less the
    first ``routed_experts_prompt_start`` (which vLLM's scheduler asserts is below the prompt's length);
    ``honours=False``: a server that drops the field and returns every row."""

    def __init__(self, replies, honours=True):
        self.replies, self.honours, self.asked, self.rows = list(replies), honours, [], []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        from recipe.adapter.routes import PROMPT_START

        start = sampling_params.get(PROMPT_START, 0) if self.honours else 0
        assert 0 <= start < len(prompt_ids)
        reply = self.replies.pop(0)
        routes = routes_of((list(prompt_ids) + reply)[:-1])[start:]
        self.asked.append(sampling_params.get(PROMPT_START))
        self.rows.append(len(routes))
        return TokenOutput(token_ids=reply, stop_reason="completed", routed_experts=routes)


def conversation(client):
    """Three turns as verl's loop sends them: the prompt, then each time the context so far plus a tool reply; the
    third turn's context re-tokenizes the second reply (its prefix no longer matches the routed tokens)."""
    async def go():
        context, outs = [1, 2, 3], []
        for turn in range(3):
            out = await client.generate("r", prompt_ids=list(context), sampling_params={"temperature": 1.0})
            outs.append(out)
            context += out.token_ids + [50 + turn, 51 + turn]  # the reply, then a tool reply (mask 0)
            if turn == 1:
                context[-5] += 100  # a boundary token re-tokenized
        return outs, context

    return asyncio.run(go())


def test_each_turn_asks_only_for_its_new_tokens_routes_and_verl_still_gets_the_whole_trajectorys():
    from recipe.adapter.routes import NewRoutesOnly

    server = Turns([[10, 11], [20, 21, 22], [30]])
    outs, _ = conversation(NewRoutesOnly(server))
    # turn 1: 3 + 2 - 1 rows; turn 2 skips them (context 7 + 3 - 1 = 9 rows, 4 held); turn 3: the prefix changed
    assert server.asked == [None, 4, None] and server.rows == [4, 5, 12]
    second = [1, 2, 3, 10, 11, 50, 51, 20, 21, 22]
    np.testing.assert_array_equal(outs[1].routed_experts, routes_of(second[:-1]))
    assert len(outs[2].routed_experts) == 12


def test_a_server_that_ignores_the_start_returns_every_row_and_nothing_is_doubled():
    from recipe.adapter.routes import NewRoutesOnly

    server = Turns([[10, 11], [20, 21, 22], [30]], honours=False)
    outs, _ = conversation(NewRoutesOnly(server))
    assert server.rows == [4, 9, 12] and [len(o.routed_experts) for o in outs] == [4, 9, 12]
