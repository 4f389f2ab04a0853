"""The group drafter's corpus (recipe/drafting/corpus.py): where a draft comes from, what bounds it, and the walk
that says what it buys on recorded responses."""
import time

import numpy as np
import pytest

from recipe.drafting.corpus import GroupCorpus

PROMPT = [100, 101, 102]


def sizes(corpus: GroupCorpus) -> dict:
    return {k: v for k, v in corpus.stats().items() if k != "bytes"}


def feed(corpus: GroupCorpus, req: str, response: list[int], prompt=PROMPT) -> None:
    corpus.observe(req, np.array(prompt + response, dtype=np.int32), len(prompt))


def test_a_request_drafts_what_followed_in_a_running_sibling():
    c = GroupCorpus(k=3, max_n=4)
    feed(c, "a", [1, 2, 3, 4, 5, 6])
    feed(c, "b", [9, 2, 3])
    assert c.propose("b") == [4, 5, 6]  # [2, 3] is b's longest match: a's continuation after it
    feed(c, "b", [9, 2, 3, 7])  # b went elsewhere: nothing followed [3, 7] or [7]
    assert c.propose("b") == []
    feed(c, "a", [1, 2, 3, 4, 5, 6, 3, 7, 8])  # a grows: b's context end now matches there
    assert c.propose("b") == [8]  # only what is known so far


def test_the_longest_match_wins_and_the_draft_is_cut_at_k():
    c = GroupCorpus(k=2, max_n=4)
    feed(c, "a", [5, 1, 1, 1])  # [5]: followed by 1
    feed(c, "b", [6, 5, 2, 2])  # [6, 5]: followed by 2
    feed(c, "c", [6, 5])
    assert c.propose("c") == [2, 2]  # [6, 5] (2 tokens) in b beats [5] (1 token) in a
    assert c.propose("c", k=1) == [2]


def test_own_context_drafts_like_prompt_lookup():
    c = GroupCorpus(k=4, max_n=3)
    feed(c, "a", [7, 8, 9, 4, 7, 8])
    assert c.propose("a") == [9, 4, 7, 8]  # its own earlier [7, 8]
    feed(c, "z", [], prompt=[1, 2, 3, 1, 2])
    assert c.propose("z") == [3, 1, 2]  # the prompt counts as context


def test_finished_responses_are_the_prompts_history_and_other_prompts_never_mix():
    c = GroupCorpus(k=3, max_n=4)
    feed(c, "epoch0", [10, 11, 12, 13])
    c.finish("epoch0")
    feed(c, "epoch1", [10])
    assert c.propose("epoch1") == [11, 12, 13]
    feed(c, "other", [10], prompt=[200, 201, 202])
    assert c.propose("other") == []
    # each prompt's tokens indexed once, however many requests share it, then the responses
    assert sizes(c) == {"prompts": 2, "running": 2, "finished": 1, "tokens": 3 + 3 + 4 + 1 + 1}


def test_max_finished_bounds_the_history_and_eviction_rebuilds_the_index():
    c = GroupCorpus(k=2, max_n=3, max_finished=2)
    for i, resp in enumerate([[1, 50, 51], [2, 60, 61], [3, 70, 71]]):  # one group of three
        feed(c, f"r{i}", resp)
    for i in range(3):
        c.finish(f"r{i}")
    assert c.stats()["finished"] == 2  # r0 evicted: the engine-wide bound
    feed(c, "q", [1])
    assert c.propose("q") == []  # r0's [1, 50, 51] is gone (its index entries too)
    feed(c, "q", [2])  # (a new request id per prompt row: q's own text is [2])
    feed(c, "q2", [3])
    assert c.propose("q2") == [70, 71]
    with pytest.raises(ValueError, match="min_n"):
        GroupCorpus(k=1, max_n=2, min_n=3)


def test_evicting_a_prompts_texts_rebuilds_its_index_and_the_last_one_drops_the_prompt():
    c = GroupCorpus(k=2, max_n=2, max_finished=3)
    for i in range(3):
        feed(c, f"old{i}", [7, 40 + i, 41 + i])
    for i in range(3):
        c.finish(f"old{i}")
    feed(c, "q", [7])
    # [102, 7] (2 tokens) is indexed where [7] recurred, in old1 (at old0, [7] was new): the longest indexed match
    assert c.propose("q") == [41, 42]
    for i in range(3):  # a newer group of another prompt pushes all three out (rebuilding the index on the way)
        feed(c, f"new{i}", [1], prompt=[200])
    for i in range(3):
        c.finish(f"new{i}")
    assert c.propose("q") == []  # nothing of old0-old2 is left to draft from
    feed(c, "q2", [7, 9])
    assert c.propose("q") == [9]  # q's prompt still indexed (q runs), and q2's response is
    c.finish("q")
    c.finish("q2")
    for i in range(3, 6):
        feed(c, f"new{i}", [1], prompt=[200])
        c.finish(f"new{i}")
    assert sizes(c) == {"prompts": 1, "running": 0, "finished": 3, "tokens": 1 + 3}  # prompt PROMPT dropped


def test_a_prompt_keeps_its_last_groups_worth_of_finished_texts():
    """History is the prompt's latest group (n: the most texts it ever ran at once), replaced as the next one
    finishes, whatever the engine-wide bound: a prompt's history lasts until it comes back."""
    c = GroupCorpus(k=2, max_n=2)
    for i in range(2):
        feed(c, f"e0-{i}", [5, 60, 61])
    for i in range(2):
        c.finish(f"e0-{i}")
    feed(c, "other", [1], prompt=[200])  # other prompts in between take nothing away
    c.finish("other")
    feed(c, "e1-0", [5, 70, 71])
    feed(c, "e1-1", [5])
    assert c.propose("e1-1") == [60, 61]  # epoch 0's group is the history (e1-0 went another way)
    c.finish("e1-0")  # the next group's first text replaces epoch 0's oldest
    assert sizes(c)["finished"] == 1 + 2
    c.finish("e1-1")
    feed(c, "e2-0", [5])
    assert c.propose("e2-0") == [70, 71]  # epoch 1's group is the history now: epoch 0's is gone
    assert sizes(c)["finished"] == 1 + 2


def test_a_request_back_in_the_batch_continues_its_own_text():
    """vLLM drops unscheduled requests from its batch and adds them back: the same text, not a second copy."""
    c = GroupCorpus(k=2, max_n=3)
    feed(c, "a", [1, 2])
    c.finish("a")
    feed(c, "a", [1, 2, 3])
    assert sizes(c) == {"prompts": 1, "running": 1, "finished": 0, "tokens": 6}
    feed(c, "b", [1, 2])
    assert c.propose("b") == [3]


def test_the_engine_adapter_drafts_per_row_and_retires_requests_that_left():
    """GroupProposer.propose with vLLM's arguments and a stand-in for the runner's input batch."""
    from types import SimpleNamespace

    from recipe.drafting.vllm_proposer import GroupProposer

    proposer = GroupProposer.__new__(GroupProposer)  # __init__ needs a vLLM config and wraps vLLM's runner
    proposer.max_model_len, proposer.corpus = 12, GroupCorpus(k=4, max_n=3)
    rows = np.zeros((3, 12), np.int32)
    rows[0, :7] = PROMPT + [1, 2, 3, 4]
    rows[1, :5] = PROMPT + [9, 2]
    rows[2, :11] = PROMPT + [5, 6, 7, 8, 5, 6, 7, 8]
    proposer.batch = SimpleNamespace(req_ids=["a", "b", "c"], num_prompt_tokens=np.array([3, 3, 3]))
    drafts = proposer.propose([[4], [2], [8]], np.array([7, 5, 11]), rows)
    assert drafts == [[], [3, 4], [5]]  # b from its sibling a; c from itself, cut at max_model_len (11 of 12)
    proposer.batch = SimpleNamespace(req_ids=["b"], num_prompt_tokens=np.array([3]))
    assert proposer.propose([[]], np.array([5]), rows[1:2]) == [[]]  # still prefilling: no draft
    assert proposer.corpus.stats()["running"] == 1 and proposer.corpus.stats()["finished"] == 2
    proposer.batch = None
    with pytest.raises(RuntimeError, match="propose_draft_token_ids"):
        proposer.propose([[1]], np.array([5]), rows[1:2])


def test_after_a_rebuild_a_request_drafts_from_a_kept_texts_first_response_token():
    """The rebuild indexes every window that ends in a kept response, the first response token's included: a new
    request whose first token is the kept text's first drafts what followed it there."""
    c = GroupCorpus(k=2, max_n=2, max_finished=1)
    feed(c, "old", [1, 2, 3, 10])
    c.finish("old")
    feed(c, "keep", [4, 8, 9])
    c.finish("keep")  # evicts "old": its 4 stale tokens outnumber keep's 3, so the prompt's index is rebuilt
    feed(c, "q", [4])
    assert c.propose("q") == [8, 9]


def _emit_cost(prompt_len: int, emitted: int = 300, seed: int = 0) -> float:
    """Seconds per emitted token for one request on a random prompt: read the token, then draft."""
    rng = np.random.default_rng(seed)
    text = rng.integers(0, 50000, prompt_len + emitted).astype(np.int32)
    c = GroupCorpus(k=4, max_n=8)
    c.observe("r", text[:prompt_len + 1], prompt_len)
    t0 = time.thread_time()
    for end in range(prompt_len + 2, prompt_len + emitted + 1):
        c.observe("r", text[:end], prompt_len)
        c.propose("r")
    return (time.thread_time() - t0) / (emitted - 1)


def _open_cost(prompt_len: int, seed: int = 0) -> float:
    text = np.random.default_rng(seed).integers(0, 50000, prompt_len + 1).astype(np.int32)
    c = GroupCorpus(k=4, max_n=8)
    t0 = time.thread_time()
    c.observe("r", text, prompt_len)
    return time.thread_time() - t0


def test_a_tokens_cost_does_not_grow_with_the_prompt_and_opening_a_prompt_is_linear():
    """Measured side by side in CPU time (interleaved, the least of five runs each), so a loaded machine slows both:
    a token's read + draft at an 8,000-token prompt costs what it costs at 250 (the exact-prompt keyed corpus:
    ~16x), and opening an 8,000-token prompt about 4x a 2,000-token one (quadratic: 16x)."""
    _emit_cost(250), _open_cost(250)  # compile
    short, long_ = [], []
    small, big = [], []
    for rep in range(5):
        short.append(_emit_cost(250, seed=rep))
        long_.append(_emit_cost(8000, seed=rep))
        small.append(_open_cost(2000, seed=rep))
        big.append(_open_cost(8000, seed=rep))
    assert min(long_) < 3 * min(short), (min(long_), min(short))
    assert min(big) < 8 * min(small), (min(big), min(small))


def test_a_later_turn_continues_its_trajectorys_text_in_the_root_prompts_group():
    """verl gives every turn a fresh vLLM request id: turn 2 of a trajectory (its prompt holds turn 1 and the tool's
    reply) continues the finished text its prompt starts with, reading only the reply, and drafts from a sibling
    trajectory's turn 2, whose history differs; a resumed response (its partial in the prompt) joins the group too."""
    c = GroupCorpus(k=3, max_n=3)
    feed(c, "a1", [1, 2, 3])
    feed(c, "b1", [4, 5, 6])
    c.finish("a1")
    c.finish("b1")
    tokens_before = sizes(c)["tokens"]
    turn2 = PROMPT + [4, 5, 6] + [70, 71]  # b's history, then the tool's reply
    c.observe("b2", np.array(turn2 + [80, 81, 82, 83]), len(turn2))
    assert sizes(c) == {"prompts": 1, "running": 1, "finished": 1, "tokens": tokens_before + 2 + 4}
    turn2 = PROMPT + [1, 2, 3] + [70, 71]  # a's own history: a prompt nobody shares
    c.observe("a2", np.array(turn2 + [80]), len(turn2))
    assert c.propose("a2") == [81, 82, 83]  # from b's second turn
    resumed = PROMPT + [9, 9]  # an aborted response's partial, resumed: no kept text is its prefix
    c.observe("r", np.array(resumed + [70]), len(resumed))
    assert c.propose("r") == [71, 80, 81] and sizes(c)["prompts"] == 1


def test_other_ranks_keep_no_corpus_and_answer_empty_drafts(monkeypatch):
    """Only vLLM's output rank's drafts reach the scheduler (tests/spec/test_vllm_spec_contract.py)."""
    from types import SimpleNamespace

    from recipe.drafting import vllm_proposer

    monkeypatch.setattr(vllm_proposer, "drafts_reach_the_scheduler", lambda: False)
    monkeypatch.setattr(vllm_proposer, "bind_input_batch", lambda: None)
    spec = SimpleNamespace(num_speculative_tokens=4, suffix_decoding_max_tree_depth=8,
                           suffix_decoding_max_cached_requests=10)
    proposer = vllm_proposer.GroupProposer(SimpleNamespace(speculative_config=spec,
                                                           model_config=SimpleNamespace(max_model_len=64)))
    assert proposer.corpus is None
    assert proposer.propose([[1], [2]], np.array([4, 4]), np.zeros((2, 64), np.int32)) == [[], []]
