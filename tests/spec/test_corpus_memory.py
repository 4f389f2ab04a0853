"""What the group corpus (recipe/drafting/corpus.py) keeps alive, measured on the arrays reachable from it (not its
own ``stats()``), over epochs of a GRPO run's prompts: retired texts and replaced groups are freed, and a byte bound
holds."""
import numpy as np
import pytest

from recipe.drafting.corpus import GroupCorpus
from recipe.drafting.live import reachable_bytes


def run_epochs(corpus: GroupCorpus, epochs: int, prompts: int = 32, n: int = 8, response: int = 160,
               per_batch: int = 8, seed: int = 0) -> list[int]:
    """Each epoch every prompt's group of ``n`` runs through ``corpus.step`` as vLLM's loop calls it, ``per_batch``
    prompts at a time, 16 tokens a step; the reachable bytes after each epoch."""
    rng = np.random.default_rng(seed)
    heads = rng.integers(0, 5000, (prompts, 48), dtype=np.int32)
    out = []
    for epoch in range(epochs):
        for b in range(0, prompts, per_batch):
            rows = np.concatenate([np.repeat(heads[b:b + per_batch], n, axis=0),
                                   rng.integers(0, 5000, (per_batch * n, response), dtype=np.int32)], axis=1)
            total = rng.integers(48 + response // 2, 48 + response + 1, per_batch * n)
            ids = [f"e{epoch}p{b + i // n}r{i % n}" for i in range(per_batch * n)]
            for end in range(49, 48 + response + 16, 16):
                live = [i for i in range(len(ids)) if end - 16 < total[i]]
                lengths = np.minimum(end, total[live]).astype(np.int64)
                corpus.step([ids[i] for i in live], np.ascontiguousarray(rows[live]), lengths,
                            np.full(len(live), 48, np.int64), np.full(len(live), 4, np.int64))
            corpus.step([], rows[:0], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
        out.append(reachable_bytes(corpus))
    return out


def test_retired_texts_and_replaced_groups_are_freed():
    """Every epoch replaces each prompt's history with its newest group (the count bound never binds): what stays
    reachable is one epoch's corpus, what ``stats()`` says, not one more corpus per epoch (the engine-wide list of
    finished texts kept every retired text and, through it, every replaced group's arrays)."""
    c = GroupCorpus(k=4, max_n=8, max_finished=100000)
    live = run_epochs(c, 8)
    assert live[-1] <= 1.1 * c.stats()["bytes"], (live, c.stats())
    assert live[-1] <= 1.1 * live[2], live  # the corpus reaches its size with the second epoch's history


def test_a_byte_bound_holds_the_live_arrays_within_10_percent_after_8_epochs():
    """With about half an epoch's corpus allowed, eviction runs every epoch: the live arrays end within 10% of the
    bound and never pass it by more (re-indexes in progress included: their old arrays get at most 10% above it)."""
    natural = run_epochs(GroupCorpus(k=4, max_n=8), 2)[-1]
    bound = natural // 2
    c = GroupCorpus(k=4, max_n=8, max_bytes=bound)
    live = run_epochs(c, 8)
    assert all(x <= 1.1 * bound for x in live), (live, bound)
    assert abs(live[-1] - bound) <= 0.1 * bound, (live, bound)
    assert 0 < c.stats()["finished"] < 32 * 8  # some history kept, not all of it


def test_bad_bounds_are_named():
    with pytest.raises(ValueError, match="max_bytes"):
        GroupCorpus(k=2, max_n=3, max_bytes=-1)
    with pytest.raises(ValueError, match="rebuild_tokens"):
        GroupCorpus(k=2, max_n=3, rebuild_tokens=0)


def test_a_re_index_reads_at_most_its_budget_plus_the_steps_tokens_in_any_step(monkeypatch):
    """A group of 8 x 2,000 tokens replaced by one of 8 x 1,000, finishing one request a step: the evicted tokens
    come to outnumber the kept ones and the group is re-indexed (~10k tokens), at most ``rebuild_tokens`` plus the
    tokens the step read in any one step (the corpus before issue 43 re-indexed it whole inside one step), drafting
    from the old arrays meanwhile; then the old arrays are let go."""
    from recipe.drafting import kernels

    fed, feed = [0], kernels.feed
    monkeypatch.setattr(kernels, "feed", lambda *a: fed.__setitem__(0, fed[0] + len(a[6])) or feed(*a))
    c = GroupCorpus(k=4, max_n=8, rebuild_tokens=512)
    rng = np.random.default_rng(0)
    head = rng.integers(0, 5000, (1, 32), dtype=np.int32)
    per_step = []
    for epoch, length in enumerate((2000, 1000)):
        rows = np.concatenate([np.repeat(head, 8, axis=0), rng.integers(0, 5000, (8, length), dtype=np.int32)], 1)
        ids = [f"e{epoch}r{i}" for i in range(8)]
        for end in range(64, rows.shape[1] + 64, 64):
            c.step(ids, rows, np.full(8, min(end, rows.shape[1]), np.int64), np.full(8, 32, np.int64),
                   np.full(8, 4, np.int64))
        for i in range(1, 9):  # one request leaves per step (reading nothing new)
            fed[0] = 0
            c.step(ids[i:], rows[i:], np.full(8 - i, rows.shape[1], np.int64), np.full(8 - i, 32, np.int64),
                   np.zeros(8 - i, np.int64))
            per_step.append(fed[0])
    other = rng.integers(5000, 9000, (1, 33), dtype=np.int32)
    for _ in range(40):  # another prompt's request keeps the engine stepping: the re-index finishes
        fed[0] = 0
        c.step(["other"], other, np.array([33], np.int64), np.array([32], np.int64), np.array([0], np.int64))
        per_step.append(fed[0])
    assert max(per_step) <= 512 + 1 and sum(per_step) >= 8000, per_step
    assert reachable_bytes(c) <= 1.05 * c.stats()["bytes"]
    assert c.stats()["finished"] == 8
