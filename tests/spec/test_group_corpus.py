"""The group drafter's corpus (recipe/drafting/corpus.py): where a draft comes from, what bounds it, and the walk
that says what it buys on recorded responses."""
import numpy as np
import pytest

from recipe.drafting.corpus import GroupCorpus

PROMPT = [100, 101, 102]


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
    assert c.stats() == {"prompts": 2, "running": 2, "finished": 1, "tokens": 3 + 3 + 4 + 1 + 1}


def test_max_finished_bounds_the_history_and_eviction_rebuilds_the_index():
    c = GroupCorpus(k=2, max_n=3, max_finished=2)
    for i, resp in enumerate([[1, 50, 51], [2, 60, 61], [3, 70, 71]]):
        feed(c, f"r{i}", resp)
        c.finish(f"r{i}")
    assert c.stats()["finished"] == 2  # r0 evicted
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
        c.finish(f"old{i}")
    feed(c, "q", [7])
    assert c.propose("q") == [40, 41]  # the first indexed occurrence: old0's
    for i in range(3):  # newer texts of another prompt push all three out (rebuilding the index on the way)
        feed(c, f"new{i}", [1], prompt=[200])
        c.finish(f"new{i}")
    assert c.propose("q") == []  # nothing of old0-old2 is left to draft from
    feed(c, "q2", [7, 9])
    assert c.propose("q") == [9]  # q's prompt still indexed (q runs), and q2's response is
    c.finish("q")
    c.finish("q2")
    for i in range(3, 6):
        feed(c, f"new{i}", [1], prompt=[200])
        c.finish(f"new{i}")
    assert c.stats() == {"prompts": 1, "running": 0, "finished": 3, "tokens": 1 + 3}  # prompt PROMPT dropped


def test_a_request_back_in_the_batch_continues_its_own_text():
    """vLLM drops unscheduled requests from its batch and adds them back: the same text, not a second copy."""
    c = GroupCorpus(k=2, max_n=3)
    feed(c, "a", [1, 2])
    c.finish("a")
    feed(c, "a", [1, 2, 3])
    assert c.stats() == {"prompts": 1, "running": 1, "finished": 0, "tokens": 6}
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
