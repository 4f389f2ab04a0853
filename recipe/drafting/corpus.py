"""What a GRPO rollout engine has already written for a prompt, as a drafting corpus.

Text repeats across a GRPO group (n samples of one prompt) and across epochs of the same prompt far more than within
one response (``python -m recipe.sim.acceptance``; docs/results.md "Speculative acceptance"). This corpus keeps, per
group, every text the engine has generated for it: the running ones as far as they have got, the finished (or
aborted) ones until its bounds push them out (Eviction, below). A request's draft is what followed the longest
indexed occurrence (``min_n`` .. ``max_n`` tokens) of its context's end anywhere in its group's texts: its own
context, its siblings' texts so far, the group's earlier texts; among occurrences of that length, the one indexed
first (an earlier position of the request's own text, or an earlier request's), else the first one indexed from
another text. A window is indexed where it ends only if its one-token-shorter suffix occurred before (``min_n``
windows always): the longer windows of a new window are new too, so the first occurrence of an n-gram is found
through its (n-1)-gram, which continues the same way. Against indexing every length at every position this drafts
the same to within 0.003 tokens per step on noisy copies of code and prose (groups of 16, 2-10% edits: 1.59-2.23
tokens per step) at 29-41 bytes per token instead of 64-204 and half the time (measured at issue 34).

Drafts are point masses, so vLLM's rejection sampler keeps every emitted token and its logprob the target model's
whatever they are: a wrong draft (a hash collision, a stale sibling) costs speed, never correctness.

**Groups.** A request opens a group keyed by its prompt's token ids (hashed once per request, in compiled code); the
group's prompt is stored and indexed once, as a text of its own, however many requests share it. A prompt that
extends a group's prompt joins that group (the longest such prompt): a later turn of a multi-turn trajectory (its
prompt holds the first turn's prompt, the history and the tool's reply; verl gives each turn a fresh vLLM request id)
continues the group's finished text its prompt starts with, reading only the new tokens, and a ``continue``-resumed
response (its partial in the prompt) continues or starts a text there. A request vLLM drops from its batch and adds
back continues its own text.

**Cost per token, whatever the prompt's or the history's length**: ``recipe/drafting/kernels.py`` (numba, one call
per group per engine step, :meth:`GroupCorpus.step`).

**Eviction.** A group keeps its last n finished texts (n: the most it ever had running at once, its GRPO group's
size with group affinity), so a prompt's history is its latest group's, replaced as its next group finishes, and an
engine holds one group per prompt it serves. Engine-wide, finished texts leave oldest first (the newest epoch's
history stays longest) while there are more than ``max_finished`` of them or the groups' arrays hold more than
``max_bytes`` (running texts are never evicted: they alone may exceed it). A text that leaves is dropped from every
list at once, and a group's last text takes the group's arrays with it. An evicted text's windows stay in its group's
table, skipped, until they outnumber the kept ones; then the group is re-indexed into fresh arrays (amortised: at most
one re-indexed token per evicted one), ``rebuild_tokens`` tokens per engine step plus as many as the step read (so
re-indexing keeps up with eviction, which cannot outrun reading), the old arrays drafting until the fresh ones have
caught up, when the old ones are let go: no step pays for a whole group (a group of 16 x 16k-token responses: 112-136
ms of CPU in one step before, at most 5.1 ms in any of the 259 steps it takes now; ``bench/group_corpus_bytes.py``).
The byte bound counts the arrays as allocated (``nbytes``, capacity included), a group being re-indexed at its fresh
arrays while its old ones keep the total within ``REINDEX_SLACK`` (10%) above the bound: after every step the arrays
hold at most 1.1 x ``max_bytes``, and ``max_bytes`` once the re-indexes in progress are done, unless the running
texts alone hold more (evicting against both arrays of a group being re-indexed instead would throw away history
the fresh arrays have room for). After eviction they hold 93-182 B per token at an epoch's end (math-like, code and
random text, epochs 2-4; 217 B where a whole epoch's groups finish in one batch, their re-indexes still running).
Nothing is checkpointed: after a restart the corpus refills from the rollouts (:func:`restart_notice`).
"""
from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from . import kernels as K
from .kernels import CLEN, DEAD, LAST, LOAD, START

REBUILD_TOKENS = 1024  # tokens a re-index reads per engine step at most (bench/group_corpus_bytes.py times it)
REINDEX_SLACK = 0.1  # how far above max_bytes the old arrays of groups being re-indexed may take the corpus


class _Ledger:
    """The bytes of one corpus's group arrays, capacity included (re-indexes in progress too)."""

    __slots__ = ("bytes",)

    def __init__(self):
        self.bytes = 0


class _Group:
    """One group's arrays (see ``recipe/drafting/kernels.py``). Text 0 is the prompt's own text."""

    def __init__(self, key, prompt: np.ndarray, min_n: int, max_n: int, ledger: _Ledger, tokens_hint: int = 0,
                 entries_hint: int = 0):
        self.key, self.min_n, self.max_n = key, min_n, max_n
        self.prompt_len = len(prompt)
        self.ledger, self.bytes = ledger, 0
        cap = 1 << max(6, int(len(prompt) + tokens_hint).bit_length())
        self.pos = np.empty((cap, 3), np.int32)
        per_token = min(2, max_n - min_n + 1)  # new text indexes one window per token, repeats a few: it grows
        self.tab = np.zeros((1 << max(6, int(max(cap * per_token, entries_hint) / LOAD).bit_length()), 2), np.uint64)
        self.meta = np.zeros(3, np.int64)  # positions taken (whole blocks), table entries, tokens held
        self.tx = np.full((4, 5), -1, np.int64)
        self.ends = np.zeros((4, max_n + 1), np.uint64)
        self._account()
        self.texts: list = [None]  # text index -> _Text (None: the prompt's own text or an evicted one)
        self.stale = 0  # tokens of evicted texts still in the arrays
        self.live = self.peak = 0  # its texts running now, and the most that ever ran at once (its GRPO group's n)
        self.finished: deque = deque()  # its finished texts, oldest first
        self.tx[0, CLEN], self.tx[0, DEAD] = 0, 0
        self.read(np.zeros((1, 2), np.int64), prompt.reshape(1, -1), np.array([len(prompt)], np.int64))

    def _account(self) -> None:
        now = self.nbytes()
        self.ledger.bytes += now - self.bytes
        self.bytes = now

    def release(self) -> None:
        """The group's arrays leave the corpus's account (the group is dropped or replaced)."""
        self.ledger.bytes -= self.bytes
        self.bytes = 0

    def new_text(self, text) -> int:
        """A request's text: it starts where its prompt ends (the prompt's windows, its last position)."""
        d = len(self.texts)
        self.texts.append(text)
        if d >= len(self.tx):
            self.tx = np.concatenate([self.tx, np.full_like(self.tx, -1)])
            self.ends = np.concatenate([self.ends, np.zeros_like(self.ends)])
            self._account()
        self.tx[d] = self.tx[0, LAST], self.tx[0, CLEN], -1, 0, -1
        self.ends[d] = self.ends[0]
        return d

    def _grow(self) -> None:
        if self.meta[0] + K.BLOCK > len(self.pos):
            self.pos = np.concatenate([self.pos, np.empty_like(self.pos)])
        if self.meta[1] + (self.max_n - self.min_n + 1) > LOAD * len(self.tab):
            tab = np.zeros((2 * len(self.tab), 2), np.uint64)
            K.rehash(self.tab, tab)
            self.tab = tab
        self._account()

    def read(self, job, tokens, lengths, want=None, out=None, out_len=None) -> None:
        """Texts ``job[:, 0]`` read rows ``job[:, 1]``'s new tokens; then, with ``want``, draft into ``out``."""
        if want is None:
            want, out, out_len = np.zeros(len(lengths), np.int64), np.empty((len(lengths), 1), np.int32), \
                np.empty(len(lengths), np.int64)
        while not K.step(self.pos, self.tab, self.tx, self.ends, self.meta, job, tokens, lengths, want, out, out_len,
                         self.min_n, self.max_n):
            self._grow()

    def feed(self, d: int, toks: np.ndarray) -> None:
        """Text ``d`` reads ``toks`` (a re-index's chunk of its own tokens)."""
        while (n := K.feed(self.pos, self.tab, self.tx, self.ends, self.meta, d, toks, self.min_n, self.max_n)) \
                < len(toks):
            toks = toks[n:]
            self._grow()

    def draft(self, d: int, k: int) -> list[int]:
        out = np.empty(k, np.int32)
        slots = np.empty(self.max_n + 1, np.int64)
        return out[:K.draft(self.pos, self.tab, self.tx, self.ends, d, k, self.min_n, self.max_n, out, slots)].tolist()

    def tokens_of(self, d: int) -> np.ndarray:
        """Text ``d``'s own tokens (a request's: its response and later turns; the prompt's: the prompt)."""
        if self.tx[d, START] < 0:
            return np.empty(0, np.int32)
        out = np.empty(int(self.tx[d, CLEN]), np.int32)
        return out[:K.walk(self.pos, int(self.tx[d, START]), out)]

    def own_tokens(self, d: int) -> int:
        return int(self.tx[d, CLEN]) - (self.prompt_len if d else 0)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.pos, self.tab, self.tx, self.ends))


class _Text:
    __slots__ = ("req_id", "group", "d", "finished")

    def __init__(self, req_id, group, d):
        self.req_id, self.group, self.d, self.finished = req_id, group, d, False


class _Rebuild:
    """A group re-indexed into fresh arrays from its kept texts (in their order of indexes), a budget of tokens per
    engine step, while its old arrays keep reading and drafting; texts that arrive or grow meanwhile are caught up."""

    def __init__(self, old: _Group, kept: list[_Text]):
        self.old = old
        tokens = sum(old.own_tokens(t.d) for t in kept)  # sized so that no table doubles inside a re-index step:
        entries = int(old.meta[1]) * (old.prompt_len + tokens) // max(1, int(old.meta[2]))  # the old's share of them
        self.fresh = _Group(old.key, old.tokens_of(0), old.min_n, old.max_n, old.ledger, tokens, entries)
        first = lambda t: old.tx[t.d, START] if old.tx[t.d, START] >= 0 else 1 << 62  # noqa: E731
        self.todo = deque(sorted(kept, key=first))
        self.at: dict[_Text, tuple[int, int, int]] = {}  # text -> its index in the old, in the fresh, tokens read

    def _behind(self, t: _Text) -> bool:
        return t not in self.at or self.at[t][2] < self.old.own_tokens(t.d)

    def advance(self, budget: int) -> int:
        """Re-index up to ``budget`` tokens; what is left of the budget once every kept text is caught up, else -1."""
        old = self.old
        while True:
            if not self.todo:
                self.todo.extend(t for t in old.texts[1:] if t is not None and self._behind(t))
                if not self.todo:
                    return budget
            if budget <= 0:
                return -1
            t = self.todo[0]
            if old.texts[t.d] is not t:  # evicted meanwhile
                self.todo.popleft()
                continue
            d, fd, got = self.at[t] if t in self.at else (t.d, self.fresh.new_text(t), 0)
            own = old.tokens_of(d)
            take = own[got:got + budget]
            self.fresh.feed(fd, take)
            self.at[t] = (d, fd, got + len(take))
            budget -= len(take)
            if got + len(take) == len(own):
                self.todo.popleft()


class GroupCorpus:
    """Texts by group, as an engine produces them, and the draft for each running request."""

    def __init__(self, k: int, max_n: int, min_n: int = 1, max_finished: int = 10000, max_bytes: int | None = None,
                 rebuild_tokens: int = REBUILD_TOKENS):
        if not 1 <= min_n <= max_n or k < 1 or max_finished < 0 or (max_bytes is not None and max_bytes < 0) \
                or rebuild_tokens < 1:
            raise ValueError(f"GroupCorpus needs 1 <= min_n ({min_n}) <= max_n ({max_n}), k ({k}) >= 1, "
                             f"max_finished ({max_finished}) >= 0, max_bytes ({max_bytes}) None or >= 0 and "
                             f"rebuild_tokens ({rebuild_tokens}) >= 1")
        self.k, self.min_n, self.max_n, self.max_finished = k, min_n, max_n, max_finished
        self.max_bytes, self.rebuild_tokens = max_bytes, rebuild_tokens
        self._ledger = _Ledger()
        self._groups: dict[tuple, _Group] = {}
        self._live: dict[str, _Text] = {}
        self._left: dict[str, _Text] = {}  # finished texts by the request id they last ran under
        self._finished: OrderedDict[_Text, None] = OrderedDict()  # every finished text, oldest first
        self._rebuilds: dict[_Group, _Rebuild] = {}  # groups being re-indexed, oldest first
        self._lengths: np.ndarray | None = None  # the groups' prompt lengths, sorted (None: to recompute)
        self._batch: tuple | None = None  # the last step's request ids and their texts' rows, reused while equal
        self._out, self._out_len = np.empty((0, k), np.int32), np.empty(0, np.int64)  # drafts, reused every step

    # -- what the engine tells it ----------------------------------------------------------------------------------
    def step(self, req_ids, tokens, lengths, prompt_lens, want) -> list[list[int]]:
        """One engine step: request ``req_ids[i]`` holds ``tokens[i, :lengths[i]]`` (its prompt, the first
        ``prompt_lens[i]``, and its output so far); each reads its new tokens, then drafts up to ``want[i]`` tokens
        (at most ``k``). Requests that were running and are not in ``req_ids`` have left the batch (finished,
        aborted, preempted): their texts stay as history."""
        n = len(req_ids)
        if self._batch is None or self._batch[0] != req_ids:
            for gone in set(self._live) - set(req_ids):
                self.finish(gone)
            texts = [self._text(r, tokens[i], int(lengths[i]), int(prompt_lens[i])) for i, r in enumerate(req_ids)]
            by_group: dict[int, tuple[_Group, list]] = {}
            for i, t in enumerate(texts):
                by_group.setdefault(id(t.group), (t.group, []))[1].append((t.d, i))
            self._batch = (list(req_ids), [(g, np.array(job, np.int64)) for g, job in by_group.values()])
        if len(self._out) < n:
            self._out, self._out_len = np.empty((2 * n, self.k), np.int32), np.empty(2 * n, np.int64)
        out, out_len = self._out[:n], self._out_len[:n]
        read = 0
        for group, job in self._batch[1]:
            before = int(group.meta[2])
            group.read(job, tokens, lengths, want, out, out_len)
            read += int(group.meta[2]) - before
        drafts = [row[:m] for row, m in zip(out.tolist(), out_len.tolist())]
        self._upkeep(read)
        return drafts

    def observe(self, req_id: str, tokens, prompt_len: int) -> None:
        """Request ``req_id`` now holds ``tokens`` (its prompt, the first ``prompt_len``, and its output so far);
        only the tokens past what was seen are read."""
        tokens = np.asarray(tokens, np.int32)
        text = self._text(req_id, tokens, len(tokens), prompt_len)
        before = int(text.group.meta[2])
        text.group.read(np.array([[text.d, 0]], np.int64), tokens.reshape(1, -1), np.array([len(tokens)], np.int64))
        self._upkeep(int(text.group.meta[2]) - before)

    def finish(self, req_id: str) -> None:
        """The request left the engine's batch (finished, aborted, preempted): its text stays as history."""
        text = self._live.pop(req_id, None)
        if text is None:
            return
        self._batch = None
        text.finished = True
        self._finished[text] = None
        self._left[req_id] = text
        g = text.group
        g.live -= 1
        g.finished.append(text)
        while len(g.finished) > g.peak:  # a prompt keeps its last group's worth of finished texts
            self._retire(g.finished[0])
        self._trim()

    def _retire(self, text: _Text) -> None:
        """A finished text leaves the corpus, and every list that named it."""
        text.finished = False
        del self._finished[text]
        text.group.finished.remove(text)
        self._evict(text)

    def _trim(self) -> None:
        """The oldest finished texts leave while more than ``max_finished`` are kept or the arrays pass
        ``max_bytes``, a group being re-indexed counted at its fresh arrays (its old ones go within a few steps) as
        long as the old ones keep the total within ``REINDEX_SLACK`` of the bound."""
        while self._finished and (len(self._finished) > self.max_finished or self._over_bytes()):
            self._retire(next(iter(self._finished)))

    def _over_bytes(self) -> bool:
        held = self._ledger.bytes
        return self.max_bytes is not None and (held > (1 + REINDEX_SLACK) * self.max_bytes
                                               or held - sum(g.bytes for g in self._rebuilds) > self.max_bytes)

    def _upkeep(self, read: int = 0) -> None:
        """After a step that read ``read`` tokens: re-index up to ``rebuild_tokens`` tokens plus as many (so the
        re-indexes keep up: at most one re-indexed token per evicted one, and no more evicted than read), the oldest
        re-index first; swap in the groups that have caught up; evict down to the bounds."""
        budget = self.rebuild_tokens + read
        while self._rebuilds and budget >= 0:
            g, job = next(iter(self._rebuilds.items()))
            budget = job.advance(budget)
            if budget >= 0:
                del self._rebuilds[g]
                self._swap(job)
        self._trim()

    def _swap(self, job: _Rebuild) -> None:
        """The fresh arrays replace the old ones, which nothing holds after this."""
        old, fresh = job.old, job.fresh
        for t, (d, fd, _) in job.at.items():
            if old.texts[d] is t:
                t.group, t.d = fresh, fd
            else:  # evicted while re-indexing
                fresh.tx[fd, DEAD] = 1
                fresh.texts[fd] = None
                fresh.stale += fresh.own_tokens(fd)
        fresh.live, fresh.peak, fresh.finished = old.live, old.peak, old.finished
        old.release()
        self._groups[old.key] = fresh
        self._batch = None

    def live(self) -> set[str]:
        return set(self._live)

    # -- the draft -------------------------------------------------------------------------------------------------
    def propose(self, req_id: str, k: int | None = None) -> list[int]:
        """Up to ``k`` (default the corpus's) tokens that followed the longest earlier occurrence of the request's
        context's end; [] when nothing of at least ``min_n`` tokens matches or nothing is known after it."""
        k = self.k if k is None else min(k, self.k)
        text = self._live[req_id]
        return text.group.draft(text.d, k) if k > 0 else []

    # -- bookkeeping -----------------------------------------------------------------------------------------------
    def _text(self, req_id: str, tokens, length: int, prompt_len: int) -> _Text:
        """The running text of ``req_id``: its own; one it left (back in the batch); for a prompt that extends a
        group's prompt (a later turn: the history, then the tool's reply; a resumed response: the partial), the kept
        text of that group it continues, or a new text there; else a new text in its prompt's group."""
        text = self._live.get(req_id)
        if text is not None:
            return text
        self._batch = None
        text = self._left.pop(req_id, None)
        if text is None:
            h = K.prefix_hashes(tokens, prompt_len)  # once per request: linear in the prompt
            group = self._groups.get((prompt_len, int(h[prompt_len])))
            if group is None:
                group = self._root(h, prompt_len)
                text = None if group is None else self._continued(group, h, prompt_len)
            if group is None:
                prompt = np.ascontiguousarray(tokens[:prompt_len], np.int32)
                group = self._groups[(prompt_len, int(h[prompt_len]))] = _Group((prompt_len, int(h[prompt_len])),
                                                                                  prompt, self.min_n, self.max_n,
                                                                                  self._ledger)
                self._lengths = None
            if text is None:
                text = _Text(req_id, group, -1)
                text.d = group.new_text(text)
        if text.finished:
            self._left.pop(text.req_id, None)
            text.finished = False
            del self._finished[text]
            text.group.finished.remove(text)
        g = text.group
        g.live += 1
        g.peak = max(g.peak, g.live)
        text.req_id = req_id
        self._live[req_id] = text
        return text

    def _root(self, h: np.ndarray, prompt_len: int) -> _Group | None:
        """The group whose prompt is the longest proper prefix of this prompt (None: none is)."""
        if self._lengths is None:
            self._lengths = np.unique(np.fromiter((key[0] for key in self._groups), np.int64, len(self._groups)))
        for n in self._lengths[:np.searchsorted(self._lengths, prompt_len)][::-1].tolist():
            group = self._groups.get((n, int(h[n])))
            if group is not None:
                return group
        return None

    def _continued(self, group: _Group, h: np.ndarray, prompt_len: int) -> _Text | None:
        """The longest finished text of ``group`` that this prompt starts with (a trajectory's earlier turn)."""
        best, seen = None, -1
        for t in group.texts[1:]:
            if t is not None and t.finished:
                n = int(group.tx[t.d, CLEN])
                if seen < n <= prompt_len and int(h[n]) == int(group.ends[t.d, group.max_n]):
                    best, seen = t, n
        return best

    def _evict(self, text: _Text) -> None:
        g = text.group
        if self._left.get(text.req_id) is text:
            del self._left[text.req_id]
        g.tx[text.d, DEAD] = 1
        g.texts[text.d] = None
        kept = [t for t in g.texts[1:] if t is not None]
        if not kept:  # the prompt's own text goes with its group's last text
            del self._groups[g.key]
            self._lengths = None
            g.release()
            job = self._rebuilds.pop(g, None)
            if job is not None:
                job.fresh.release()
            return
        g.stale += g.own_tokens(text.d)
        if g not in self._rebuilds and g.stale > sum(g.own_tokens(t.d) for t in kept):
            self._rebuilds[g] = _Rebuild(g, kept)

    def stats(self) -> dict:
        """Sizes, for metrics and the memory bound: groups, texts (running, finished), tokens held (each group's
        prompt once, then every text's own) and the arrays' bytes (capacity and re-indexes in progress included)."""
        return {"prompts": len(self._groups), "running": len(self._live), "finished": len(self._finished),
                "tokens": sum(int(g.meta[2]) - g.stale for g in self._groups.values()),
                "bytes": self._ledger.bytes}



def warm_up() -> dict:
    """Compile the kernels for the engine's argument types, or load them from the node's cache, before the first
    step (``kernels.compile_once``: one engine per node compiles): a few requests through every path (steps, a
    table that doubles, eviction, a re-index over several steps). Returns what it cost (``compile_once``)."""
    with K.compile_once() as cost:
        c = GroupCorpus(k=2, max_n=3, max_finished=2, rebuild_tokens=8)
        rows = (np.arange(2 * 96, dtype=np.int32) % 37).reshape(2, 96)
        for epoch in range(3):
            ids = [f"e{epoch}r0", f"e{epoch}r1"]
            for end in range(8, 97, 8):
                c.step(ids, rows, np.full(2, end, np.int64), np.full(2, 4, np.int64), np.full(2, 2, np.int64))
            c.propose(ids[0])
            c.step([], rows[:0], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
        c.observe("o", rows[0, :9], 4)
    return cost


def restart_notice(corpus: GroupCorpus) -> str:
    """The line an engine logs at start: what a restart loses (the corpus is not checkpointed) and its bounds."""
    bound = "none" if corpus.max_bytes is None else f"{corpus.max_bytes / 2**30:.3g} GiB"
    return ("recipe group drafter: this engine's corpus starts empty (it is not checkpointed): after a restart or "
            "resume, each prompt drafts from its own context and its running siblings only, without its earlier "
            "epochs' responses, until its group has finished once on this engine again; bounds per engine: "
            f"{bound} of arrays (ROLLOUT_SPECULATIVE_CORPUS_GIB), {corpus.max_finished} finished texts "
            "(ROLLOUT_SPECULATIVE_SUFFIX_CACHED)")
