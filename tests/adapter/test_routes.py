"""``recipe.adapter.routes.cover_routes`` against a scripted server: when it re-prefills, what it asks for, and what
leaves the loss when routes cannot be had (the engine paths: tests/adapter/test_routes_engine.py)."""
import asyncio
import json

import numpy as np
import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.workers.rollout.replica import TokenOutput

from recipe.adapter.routes import UNROUTED, cover_routes, covered_tokens

LAYERS, TOP_K = 3, 2


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": LAYERS, "num_experts_per_tok": TOP_K}))
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
    assert out.routed_experts.shape == (4, LAYERS, TOP_K)


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
