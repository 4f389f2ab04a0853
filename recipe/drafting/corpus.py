"""What a GRPO rollout engine has already written for a prompt, as a drafting corpus.

Text repeats across a GRPO group (n samples of one prompt) and across epochs of the same prompt far more than within
one response (``python -m recipe.sim.acceptance``; docs/results.md "Speculative acceptance"). This corpus keeps, per
group, every text the engine has generated for it: the running ones as far as they have got, the finished (or
aborted) ones until ``max_finished`` newer ones push them out. A request's draft is what followed the longest
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

**Cost per token, whatever the prompt's or the history's length.** Each group holds numpy arrays: its texts' tokens
in order of arrival, each with the position of its text's next token, and one open-addressing table from a hash of
(window length, window) to the first position where that window ended and the first from another text. A text keeps
the rolling hashes of its last ``max_n`` windows, so reading a token costs at most ``max_n - min_n + 1`` table
probes (one for new text) and a draft one probe per indexed length plus one, then ``k`` linked reads: no step depends on how
long the prompt or the history is. Both run in numba-compiled kernels (numba ships with vLLM), one call per group per
engine step (:meth:`GroupCorpus.step`). arctic-inference's suffix trees (vLLM's ``suffix``) would be the maintained
alternative, but PyPI carries no binary wheel of it for CPython x86_64 (0.1.0-0.3.0 are source only, built with
torch 2.7 and CUDA kernels), and its cache keeps one global tree of every cached response, not one per group.

**Eviction.** A group keeps its last n finished texts (n: the most it ever had running at once, its GRPO group's
size with group affinity), so a prompt's history is its latest group's, replaced as its next group finishes, and an
engine holds one group per prompt it serves; at most ``max_finished`` finished texts in all (the oldest go first).
An evicted text's windows stay in its group's table, skipped, until they outnumber the kept ones, when the group is
re-indexed from its kept texts (amortised: at most one re-indexed token per evicted one; a burst is bounded by one
group's size). A group's last text takes the group with it. Memory: ``bench/group_drafter_cost.py`` measures bytes
per token held (the arrays' ``nbytes``, :meth:`GroupCorpus.stats`). Nothing is checkpointed: after a restart the
corpus refills from the rollouts.
"""
from __future__ import annotations

from collections import deque

import numpy as np
from numba import njit

_B = np.uint64(0x100000001B3)  # the rolling hash's base (odd): windows hash mod 2^64
_LOAD = 0.7  # the tables' largest fill before they double
# columns: pos (int32): token, next position of its text (-1: none yet), its text; tx (int64): a text's last position,
# context length (prompt included), first own position, evicted; ends (uint64): the text's last max_n window hashes,
# then the hash of its whole context; tab (uint64): key (0: empty), first + 1 | (second + 1) << 32
TOK, NXT, OWNER = 0, 1, 2
LAST, CLEN, START, DEAD, FREE = 0, 1, 2, 3, 4  # FREE: the text's next free position in its block (-1: none)
BLOCK = 32  # positions a text takes at a time: its tokens mostly contiguous, so a draft reads one cache line or two
_LO = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _mix(h, n):
    """A table key for the window hash ``h`` of length ``n`` (splitmix64; never 0, the empty slot)."""
    z = h ^ (np.uint64(n) * np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) | np.uint64(1)


@njit(cache=True, nogil=True)
def _prefix_hashes(tokens, n):
    """The hashes of ``tokens[:i]`` for i = 0 .. n (a group's key is its prompt's; a text's, its whole context's)."""
    h = np.zeros(n + 1, np.uint64)
    for i in range(n):
        h[i + 1] = h[i] * _B + np.uint64(tokens[i] + 1)
    return h


@njit(cache=True, nogil=True)
def _slot(tab, key):
    mask = len(tab) - 1
    i = np.int64(key & np.uint64(mask))
    while tab[i, 0] != 0 and tab[i, 0] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True, nogil=True)
def _append(pos, tab, tx, ends, meta, d, t, min_n, max_n):
    """Text ``d`` reads token ``t``: stored at the next position, linked from the text's last one, and the windows
    ending at it indexed from ``min_n`` tokens up to the first one not seen before (at most ``max_n``)."""
    p = tx[d, FREE]
    if p < 0 or p % BLOCK == 0:  # the text's block is full (or it has none): a new one
        p = meta[0]
        meta[0] = p + BLOCK
    tx[d, FREE] = p + 1
    meta[2] += 1
    pos[p, TOK], pos[p, NXT], pos[p, OWNER] = t, -1, d
    q = tx[d, LAST]
    if q >= 0 and pos[q, OWNER] == d:  # a request's first token follows its group's prompt text: no link from there
        pos[q, NXT] = p
    if tx[d, START] < 0:
        tx[d, START] = p
    tx[d, LAST] = p
    x = np.uint64(t + 1)
    for j in range(max_n - 1, 0, -1):
        ends[d, j] = ends[d, j - 1] * _B + x
    ends[d, 0] = x
    ends[d, max_n] = ends[d, max_n] * _B + x
    tx[d, CLEN] += 1
    for n in range(min_n, min(max_n, tx[d, CLEN]) + 1):
        key = _mix(ends[d, n - 1], n)
        i = _slot(tab, key)
        if tab[i, 0] == 0:
            tab[i, 0], tab[i, 1] = key, np.uint64(p + 1)
            meta[1] += 1
            break  # a new window: its longer ones are new too, indexed only once this one recurs
        v = tab[i, 1]
        first, second = np.int64(v & _LO) - 1, np.int64(v >> np.uint64(32)) - 1
        if tx[pos[first, OWNER], DEAD]:  # an evicted text's entry, not yet re-indexed away: the live text takes it
            first = p
        elif pos[first, OWNER] != d and (second < 0 or tx[pos[second, OWNER], DEAD]):
            second = p
        else:
            continue
        tab[i, 1] = np.uint64(first + 1) | (np.uint64(second + 1) << np.uint64(32))


@njit(cache=True, nogil=True)
def _draft(pos, tab, tx, ends, d, k, min_n, max_n, out, slots):
    """Up to ``k`` tokens that followed the longest indexed occurrence of text ``d``'s end, into ``out``; their
    number (``slots``: scratch of ``max_n + 1``). A window is indexed only where its one-shorter suffix is, so the indexed lengths are ``min_n`` up to the
    first missing one: found going up, then from the longest down the first with a usable occurrence wins."""
    here = tx[d, LAST]
    top = min_n - 1
    for n in range(min_n, min(max_n, tx[d, CLEN]) + 1):
        i = _slot(tab, _mix(ends[d, n - 1], n))
        if tab[i, 0] == 0:
            break
        slots[n], top = i, n
    for n in range(top, min_n - 1, -1):
        v = tab[slots[n], 1]
        for c in (np.int64(v & _LO) - 1, np.int64(v >> np.uint64(32)) - 1):
            if c < 0 or c == here or tx[pos[c, OWNER], DEAD]:
                continue
            q, m = pos[c, NXT], 0
            while q >= 0 and m < k:
                out[m] = pos[q, TOK]
                m += 1
                q = pos[q, NXT]
            if m:
                return m
    return 0


@njit(cache=True, nogil=True)
def _step(pos, tab, tx, ends, meta, job, tokens, lengths, want, out, out_len, min_n, max_n):
    """One engine step for one group: each text ``job[i, 0]`` reads row ``job[i, 1]``'s new tokens
    (``tokens[row, clen:lengths[row]]``), then drafts up to ``want[row]`` tokens (at most ``out``'s width) into
    ``out[row]``. Returns False,
    having read what fitted, when the arrays need to grow first (the caller grows them and calls again)."""
    per_token = max_n - min_n + 1
    slots = np.empty(max_n + 1, np.int64)
    for i in range(len(job)):
        d, r = job[i, 0], job[i, 1]
        for j in range(tx[d, CLEN], lengths[r]):
            if meta[0] + BLOCK > len(pos) or meta[1] + per_token > _LOAD * len(tab):
                return False
            _append(pos, tab, tx, ends, meta, d, tokens[r, j], min_n, max_n)
    for i in range(len(job)):
        d, r = job[i, 0], job[i, 1]
        k = min(want[r], out.shape[1])
        out_len[r] = _draft(pos, tab, tx, ends, d, k, min_n, max_n, out[r], slots) if k > 0 else 0
    return True


@njit(cache=True, nogil=True)
def _rehash(tab, new):
    for i in range(len(tab)):
        if tab[i, 0] != 0:
            j = _slot(new, tab[i, 0])
            new[j, 0], new[j, 1] = tab[i, 0], tab[i, 1]


@njit(cache=True, nogil=True)
def _text(pos, start, out):
    """The tokens of a text from position ``start`` on, following its links, into ``out``; their number."""
    m, q = 0, start
    while q >= 0:
        out[m] = pos[q, TOK]
        m += 1
        q = pos[q, NXT]
    return m


class _Group:
    """One group's arrays (see the module docstring). Text 0 is the prompt's own text."""

    def __init__(self, key, prompt: np.ndarray, min_n: int, max_n: int, tokens_hint: int = 0):
        self.key, self.min_n, self.max_n = key, min_n, max_n
        self.prompt_len = len(prompt)
        cap = 1 << max(6, int(len(prompt) + tokens_hint).bit_length())
        self.pos = np.empty((cap, 3), np.int32)
        per_token = min(2, max_n - min_n + 1)  # new text indexes one window per token, repeats a few: it grows
        self.tab = np.zeros((1 << max(6, int(cap * per_token / _LOAD).bit_length()), 2), np.uint64)
        self.meta = np.zeros(3, np.int64)  # positions taken (whole blocks), table entries, tokens held
        self.tx = np.full((4, 5), -1, np.int64)
        self.ends = np.zeros((4, max_n + 1), np.uint64)
        self.texts: list = [None]  # text index -> _Text (None: the prompt's own text or an evicted one)
        self.stale = 0  # tokens of evicted texts still in the arrays
        self.live = self.peak = 0  # its texts running now, and the most that ever ran at once (its GRPO group's n)
        self.finished: deque = deque()  # its finished texts, oldest first
        self.tx[0, CLEN], self.tx[0, DEAD] = 0, 0
        self.read(np.zeros((1, 2), np.int64), prompt.reshape(1, -1), np.array([len(prompt)], np.int64))

    def new_text(self, text) -> int:
        """A request's text: it starts where its prompt ends (the prompt's windows, its last position)."""
        d = len(self.texts)
        self.texts.append(text)
        if d >= len(self.tx):
            self.tx = np.concatenate([self.tx, np.full_like(self.tx, -1)])
            self.ends = np.concatenate([self.ends, np.zeros_like(self.ends)])
        self.tx[d] = self.tx[0, LAST], self.tx[0, CLEN], -1, 0, -1
        self.ends[d] = self.ends[0]
        return d

    def _grow(self) -> None:
        if self.meta[0] + BLOCK > len(self.pos):
            self.pos = np.concatenate([self.pos, np.empty_like(self.pos)])
        if self.meta[1] + (self.max_n - self.min_n + 1) > _LOAD * len(self.tab):
            tab = np.zeros((2 * len(self.tab), 2), np.uint64)
            _rehash(self.tab, tab)
            self.tab = tab

    def read(self, job, tokens, lengths, want=None, out=None, out_len=None) -> None:
        """Texts ``job[:, 0]`` read rows ``job[:, 1]``'s new tokens; then, with ``want``, draft into ``out``."""
        if want is None:
            want, out, out_len = np.zeros(len(lengths), np.int64), np.empty((len(lengths), 1), np.int32), \
                np.empty(len(lengths), np.int64)
        while not _step(self.pos, self.tab, self.tx, self.ends, self.meta, job, tokens, lengths, want, out, out_len,
                        self.min_n, self.max_n):
            self._grow()

    def draft(self, d: int, k: int) -> list[int]:
        out = np.empty(k, np.int32)
        slots = np.empty(self.max_n + 1, np.int64)
        return out[:_draft(self.pos, self.tab, self.tx, self.ends, d, k, self.min_n, self.max_n, out, slots)].tolist()

    def tokens_of(self, d: int) -> np.ndarray:
        """Text ``d``'s own tokens (a request's: its response and later turns; the prompt's: the prompt)."""
        if self.tx[d, START] < 0:
            return np.empty(0, np.int32)
        out = np.empty(int(self.tx[d, CLEN]), np.int32)
        return out[:_text(self.pos, int(self.tx[d, START]), out)]

    def own_tokens(self, d: int) -> int:
        return int(self.tx[d, CLEN]) - (self.prompt_len if d else 0)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.pos, self.tab, self.tx, self.ends))


class _Text:
    __slots__ = ("req_id", "group", "d", "finished")

    def __init__(self, req_id, group, d):
        self.req_id, self.group, self.d, self.finished = req_id, group, d, 0  # finished: its finish's number, or 0


class GroupCorpus:
    """Texts by group, as an engine produces them, and the draft for each running request."""

    def __init__(self, k: int, max_n: int, min_n: int = 1, max_finished: int = 10000):
        if not 1 <= min_n <= max_n or k < 1 or max_finished < 0:
            raise ValueError(f"GroupCorpus needs 1 <= min_n ({min_n}) <= max_n ({max_n}), k ({k}) >= 1 and "
                             f"max_finished ({max_finished}) >= 0")
        self.k, self.min_n, self.max_n, self.max_finished = k, min_n, max_n, max_finished
        self._groups: dict[tuple, _Group] = {}
        self._live: dict[str, _Text] = {}
        self._left: dict[str, _Text] = {}  # request id -> its finished text, while kept
        self._finished: deque[tuple[_Text, int]] = deque()  # (text, its finish's number): stale once it came back
        self._n_finished = self._finishes = 0
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
        for group, job in self._batch[1]:
            group.read(job, tokens, lengths, want, out, out_len)
        return [row[:m] for row, m in zip(out.tolist(), out_len.tolist())]

    def observe(self, req_id: str, tokens, prompt_len: int) -> None:
        """Request ``req_id`` now holds ``tokens`` (its prompt, the first ``prompt_len``, and its output so far);
        only the tokens past what was seen are read."""
        tokens = np.asarray(tokens, np.int32)
        text = self._text(req_id, tokens, len(tokens), prompt_len)
        text.group.read(np.array([[text.d, 0]], np.int64), tokens.reshape(1, -1), np.array([len(tokens)], np.int64))

    def finish(self, req_id: str) -> None:
        """The request left the engine's batch (finished, aborted, preempted): its text stays as history."""
        text = self._live.pop(req_id, None)
        if text is None:
            return
        self._batch = None
        self._finishes += 1
        text.finished = self._finishes
        self._finished.append((text, self._finishes))
        self._n_finished += 1
        self._left[req_id] = text
        g = text.group
        g.live -= 1
        g.finished.append(text)
        while len(g.finished) > g.peak:  # a prompt keeps its last group's worth of finished texts
            self._retire(g.finished[0])
        while self._n_finished > self.max_finished:
            old, when = self._finished.popleft()
            if old.finished == when:  # else it came back to the batch since (or left already)
                self._retire(old)

    def _retire(self, text: _Text) -> None:
        """A finished text leaves the corpus (its entry in the engine-wide FIFO goes stale)."""
        text.finished = 0
        self._n_finished -= 1
        text.group.finished.remove(text)
        self._evict(text)

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
            h = _prefix_hashes(tokens, prompt_len)  # once per request: linear in the prompt
            group = self._groups.get((prompt_len, int(h[prompt_len])))
            if group is None:
                group = self._root(h, prompt_len)
                text = None if group is None else self._continued(group, h, prompt_len)
            if group is None:
                prompt = np.ascontiguousarray(tokens[:prompt_len], np.int32)
                group = self._groups[(prompt_len, int(h[prompt_len]))] = _Group((prompt_len, int(h[prompt_len])),
                                                                                  prompt, self.min_n, self.max_n)
                self._lengths = None
            if text is None:
                text = _Text(req_id, group, -1)
                text.d = group.new_text(text)
        if text.finished:
            self._left.pop(text.req_id, None)
            text.finished = 0
            self._n_finished -= 1
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
            return
        g.stale += g.own_tokens(text.d)
        if g.stale > sum(g.own_tokens(t.d) for t in kept):
            self._rebuild(g, kept)

    def _rebuild(self, g: _Group, kept: list[_Text]) -> None:
        """Index the group's kept texts afresh, in their order of indexes (amortised: only once evicted tokens
        outnumber the kept ones)."""
        prompt = g.tokens_of(0)
        fresh = _Group(g.key, prompt, self.min_n, self.max_n, sum(g.own_tokens(t.d) for t in kept))
        for t in sorted(kept, key=lambda t: g.tx[t.d, START] if g.tx[t.d, START] >= 0 else 1 << 62):
            own = g.tokens_of(t.d)
            t.d, t.group = fresh.new_text(t), fresh
            row = np.concatenate([prompt, own]).reshape(1, -1)
            fresh.read(np.array([[t.d, 0]], np.int64), row, np.array([row.shape[1]], np.int64))
        fresh.live, fresh.peak, fresh.finished = g.live, g.peak, g.finished
        self._groups[g.key] = fresh
        self._batch = None

    def stats(self) -> dict:
        """Sizes, for metrics and the memory bound: groups, texts (running, finished), tokens held (each group's
        prompt once, then every text's own) and the arrays' bytes."""
        return {"prompts": len(self._groups), "running": len(self._live), "finished": self._n_finished,
                "tokens": sum(int(g.meta[2]) - g.stale for g in self._groups.values()),
                "bytes": sum(g.nbytes() for g in self._groups.values())}

