"""recipe/adapter/partial.py: ``ContinueFrom`` against a scripted server, the single-turn loop resuming through it,
and ``fetch_partial`` against a real TransferQueue on records written the way verl's ``AgentLoopWorkerTQ`` writes an
agent loop's output (``AgentLoopOutput.as_dict()`` plus the row fields, one put per session). The multi-turn resume
is tested in test_tool_agent_loop.py."""
import asyncio

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.rollout.replica import TokenOutput

from recipe.adapter.fields import CAP, PARTIAL
from recipe.adapter.partial import RESUME_AT, ContinueFrom, PartialRef, StoredResponse, fetch_partial


class Server:
    """Returns ``replies`` in turn (token ids, log-prob each, stop reason); records each call."""

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((list(prompt_ids), dict(sampling_params)))
        ids, logprob, stop = self.replies.pop(0)
        return TokenOutput(token_ids=ids, log_probs=[logprob] * len(ids) if ids else None, stop_reason=stop,
                           extra_fields={"global_steps": 4, "min_global_steps": 4, "max_global_steps": 4})


def continue_from(server, limit=10):
    return ContinueFrom(server, [5, 6], [-0.1, -0.2], complete=False, min_version=2, limit=limit)


def test_only_the_first_call_continues_within_the_requests_own_budget():
    server = Server([([7], -0.3, "completed"), ([8, 9], -0.4, "completed")])
    client = continue_from(server)
    first = asyncio.run(client.generate("r", prompt_ids=[1, 2], sampling_params={"max_tokens": 6}))
    assert server.calls[0] == ([1, 2, 5, 6], {"max_tokens": 4})  # the turn's 6 tokens, 2 of them stored
    assert (first.token_ids, first.log_probs) == ([5, 6, 7], [-0.1, -0.2, -0.3])
    assert (first.extra_fields["min_global_steps"], first.extra_fields["max_global_steps"]) == (2, 4)
    second = asyncio.run(client.generate("r", prompt_ids=[1, 2, 5, 6, 7, 0], sampling_params={"max_tokens": 3}))
    assert server.calls[1] == ([1, 2, 5, 6, 7, 0], {"max_tokens": 3}) and second.token_ids == [8, 9]


def test_an_empty_continuation_keeps_the_stored_tokens_and_log_probs():
    """Aborted again before its first token (vLLM rejecting a late request): the stored part stays whole."""
    out = asyncio.run(continue_from(Server([([], 0.0, "aborted")])).generate("r", prompt_ids=[1],
                                                                              sampling_params={}))
    assert (out.token_ids, out.log_probs, out.stop_reason) == ([5, 6], [-0.1, -0.2], "aborted")


def test_stored_tokens_that_fill_the_budget_are_returned_without_a_request():
    server = Server([])
    out = asyncio.run(continue_from(server, limit=2).generate("r", prompt_ids=[1], sampling_params={}))
    assert server.calls == [] and (out.token_ids, out.stop_reason) == ([5, 6], "completed")


def test_a_single_turn_response_resumes_after_its_stored_tokens(recipe_config, monkeypatch):
    """CappedSingleTurnAgentLoop: verl's loop sees one response, the stored tokens plus the continuation."""
    from transformers import AutoTokenizer

    from recipe.route_record.config import build_agent_loop

    async def fetch(ref, session, turns=False):
        assert (ref.key(session), turns) == ("u_0_0", False)
        return StoredResponse(tokens=[5, 6], logprobs=[-0.1, -0.2])

    monkeypatch.setattr("recipe.adapter.agent_loop.fetch_partial", fetch)
    server = Server([([7, 8], -0.3, "completed")])
    tokenizer = AutoTokenizer.from_pretrained(recipe_config.actor_rollout_ref.model.path)
    ref = PartialRef(key_prefix="u", partition_id="train", complete=[False], min_version=2, resumes=1,
                     has_logprobs=True)

    async def go():
        loop = build_agent_loop(recipe_config, server, tokenizer)
        return await loop.run({"logprobs": True}, raw_prompt=[{"role": "user", "content": "hi"}], session_id=0,
                              **{CAP: 20, PARTIAL: ref.to_json()})

    out = asyncio.run(go())
    prompt, params = server.calls[0]
    assert prompt[-2:] == [5, 6] and params["max_tokens"] == 18
    assert (out.response_ids, out.response_mask, out.response_logprobs) == (
        [5, 6, 7, 8], [1] * 4, [-0.1, -0.2, -0.3, -0.3])


def put(tq, key, out):
    tq.kv_batch_put(keys=[key], partition_id="train", fields=list_of_dict_to_tensordict([
        {**out.as_dict(), "session_id": int(key.split("_")[1])}]), tags=[{"status": "success"}])


def test_a_multi_turn_record_comes_back_whole_from_transfer_queue(tq_cluster):
    snapshot = {"stage": "tools", "tokens": 5, "messages": [{"role": "assistant", "content": "",
                                                             "tool_calls": [{"type": "function"}]}]}
    outs = [AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=list(range(10, 10 + n)), response_mask=mask,
                            response_logprobs=[-0.5] * n, num_turns=turns,
                            metrics=AgentLoopMetrics(generate_sequences=1.5, tool_calls=0.25),
                            extra_fields={"min_global_steps": 3, RESUME_AT: snapshot})
            for n, mask, turns in [(5, [1, 1, 0, 0, 1], 4), (2, [1, 1], 2)]]
    for session, out in enumerate(outs):
        put(tq_cluster, f"u_{session}_0", out)
    ref = PartialRef(key_prefix="u", partition_id="train", complete=[False, False], min_version=3, resumes=1,
                     has_logprobs=True)

    first = asyncio.run(fetch_partial(ref, 0, turns=True))
    assert (first.prompt, first.tokens, first.mask, first.logprobs, first.num_turns) == (
        [1, 2, 3], [10, 11, 12, 13, 14], [1, 1, 0, 0, 1], [-0.5] * 5, 4)
    assert first.metrics["generate_sequences"] == 1.5 and first.metrics["tool_calls"] == 0.25
    assert first.extra_fields == {"min_global_steps": 3, RESUME_AT: snapshot}
    second = asyncio.run(fetch_partial(ref, 1))  # single-turn reads: the tokens only
    assert (second.tokens, second.logprobs, second.mask, second.extra_fields) == ([10, 11], [-0.5] * 2, [], {})


def test_a_response_cut_before_its_first_token_has_no_log_probs_to_read(tq_cluster):
    """verl stores no ``rollout_log_probs`` for an empty response (queued when the abort came, or a multi-turn
    trajectory cut before its first turn): it resumes with none."""
    put(tq_cluster, "e_0_0", AgentLoopOutput(prompt_ids=[1, 2], response_ids=[], response_mask=[], num_turns=2,
                                             metrics=AgentLoopMetrics(), extra_fields={RESUME_AT: {}}))
    ref = PartialRef(key_prefix="e", partition_id="train", complete=[False], min_version=0, resumes=1,
                     has_logprobs=True)
    stored = asyncio.run(fetch_partial(ref, 0, turns=True))
    assert (stored.tokens, stored.logprobs, stored.mask, stored.extra_fields) == ([], [], [], {RESUME_AT: {}})
