"""What a GRPO rollout engine has already written for a prompt, as a drafting corpus.

Text repeats across a GRPO group (n samples of one prompt) and across epochs of the same prompt far more than within
one response (``python -m recipe.sim.acceptance``; docs/results.md "Speculative acceptance"). This corpus keeps, per
prompt, every response the engine has generated for it: the running ones as far as they have got, the finished (or
aborted) ones until ``max_finished`` newer ones push them out. A request's draft is what followed the longest
occurrence (``min_n`` .. ``max_n`` tokens) of its context's end anywhere in its prompt's texts: its own context,
its siblings' responses so far, the prompt's earlier responses. The longest match wins; among occurrences of that
length, the one indexed first (an earlier position of the request's own text, or an earlier request's).

Drafts are point masses, so vLLM's rejection sampler keeps every emitted token and its logprob the target model's
whatever they are: a wrong draft (a hash collision, a stale sibling) costs speed, never correctness.

A prompt is its exact token ids (a multi-turn request's later turns carry their history in the prompt, so they group
only with requests of the same history). Its tokens are indexed once, as a text of their own, however many requests
share it; each request's text indexes only the windows ending in its response (they may start in the prompt).
Memory: each indexed token holds one dict entry per window length (``bench/group_drafter.py`` prints the measured
bytes per token); the bound is ``max_finished`` finished responses per engine, plus the running ones and one copy of
each of their prompts. Nothing is checkpointed: after a restart the corpus refills from the rollouts.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

_MOD = (1 << 61) - 1  # a Mersenne prime: polynomial hashes of windows, one table per window length
_BASE = random.Random(0x5EED).randrange(1 << 20, _MOD - 1)
_SHIFT = 32  # a position packs into one int: doc id << 32 | end


@dataclass
class _Doc:
    req_id: str | None  # None: a prompt's own text
    key: tuple
    tokens: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # hashes of the windows ending at the last token, length 1, 2, ..


@dataclass
class _Prompt:
    """One prompt: its own text (``doc``), its requests' texts and their index: per window length, the first two
    positions (from different texts where there are two) where each window ends."""

    doc: int
    docs: list[int]
    first: list[dict]
    second: list[dict]
    stale: int = 0  # response tokens of evicted texts still in the index


class GroupCorpus:
    """Texts by prompt, as an engine produces them, and the draft for each running request."""

    def __init__(self, k: int, max_n: int, min_n: int = 1, max_finished: int = 10000):
        if not 1 <= min_n <= max_n or k < 1 or max_finished < 0:
            raise ValueError(f"GroupCorpus needs 1 <= min_n ({min_n}) <= max_n ({max_n}), k ({k}) >= 1 and "
                             f"max_finished ({max_finished}) >= 0")
        self.k, self.min_n, self.max_n, self.max_finished = k, min_n, max_n, max_finished
        self._docs: dict[int, _Doc] = {}
        self._prompts: dict[tuple, _Prompt] = {}
        self._live: dict[str, int] = {}  # request id -> doc id
        self._left: dict[str, int] = {}  # request id -> doc id, for the finished texts still kept
        self._finished: deque[int] = deque()
        self._next_id = 0

    # -- what the engine tells it ----------------------------------------------------------------------------------
    def observe(self, req_id: str, tokens, prompt_len: int) -> None:
        """Request ``req_id`` now holds ``tokens`` (its prompt, the first ``prompt_len``, and its output so far);
        only the tokens past what was seen are read. A request that left and comes back (vLLM drops unscheduled
        requests from its batch) continues its own text."""
        doc_id = self._live.get(req_id)
        if doc_id is None:
            doc_id = self._left.pop(req_id, None)
            if doc_id is not None:
                self._finished.remove(doc_id)
                self._live[req_id] = doc_id
            else:
                doc_id = self._open(req_id, tuple(int(t) for t in tokens[:prompt_len]))
        doc = self._docs[doc_id]
        for token in tokens[len(doc.tokens):]:
            self._append(doc_id, doc, int(token))

    def finish(self, req_id: str) -> None:
        """The request left the engine's batch (finished, aborted, preempted): its text stays as history."""
        doc_id = self._live.pop(req_id, None)
        if doc_id is None:
            return
        self._finished.append(doc_id)
        self._left[req_id] = doc_id
        while len(self._finished) > self.max_finished:
            self._evict(self._finished.popleft())

    def live(self) -> set[str]:
        return set(self._live)

    # -- the draft -------------------------------------------------------------------------------------------------
    def propose(self, req_id: str, k: int | None = None) -> list[int]:
        """Up to ``k`` (default the corpus's) tokens that followed the longest earlier occurrence of the request's
        context's end; [] when nothing of at least ``min_n`` tokens matches or nothing is known after it."""
        k = self.k if k is None else min(k, self.k)
        doc_id = self._live[req_id]
        doc = self._docs[doc_id]
        if k <= 0 or not doc.tokens:
            return []
        prompt = self._prompts[doc.key]
        here = (doc_id << _SHIFT) | (len(doc.tokens) - 1)
        for n in range(min(self.max_n, len(doc.ends)), self.min_n - 1, -1):
            h = doc.ends[n - 1]
            for table in (prompt.first[n - 1], prompt.second[n - 1]):
                at = table.get(h)
                if at is None or at == here:
                    continue
                other = self._docs.get(at >> _SHIFT)
                if other is None:  # evicted, not yet rebuilt away
                    continue
                end = at & ((1 << _SHIFT) - 1)
                draft = other.tokens[end + 1:end + 1 + k]
                if draft:
                    return draft
        return []

    # -- bookkeeping -----------------------------------------------------------------------------------------------
    def _new_doc(self, req_id: str | None, key: tuple) -> int:
        doc_id, self._next_id = self._next_id, self._next_id + 1
        self._docs[doc_id] = _Doc(req_id, key)
        return doc_id

    def _open(self, req_id: str, key: tuple) -> int:
        """A request's text: its prompt copied in (indexed once, in the prompt's own text), then its response."""
        prompt = self._prompts.get(key)
        if prompt is None:
            text = self._new_doc(None, key)
            prompt = self._prompts[key] = _Prompt(text, [], [{} for _ in range(self.max_n)],
                                                  [{} for _ in range(self.max_n)])
            for token in key:
                self._append(text, self._docs[text], token)
        own = self._docs[prompt.doc]
        doc_id = self._new_doc(req_id, key)
        self._docs[doc_id].tokens, self._docs[doc_id].ends = list(own.tokens), list(own.ends)
        prompt.docs.append(doc_id)
        self._live[req_id] = doc_id
        return doc_id

    def _roll(self, ends: list[int], token: int) -> list[int]:
        """The window hashes ending at ``token`` from those ending at the token before it."""
        x = token + 1
        return [x % _MOD] + [(h * _BASE + x) % _MOD for h in ends[:self.max_n - 1]]

    def _append(self, doc_id: int, doc: _Doc, token: int) -> None:
        doc.ends = self._roll(doc.ends, token)
        doc.tokens.append(token)
        self._index(self._prompts[doc.key], doc_id, len(doc.tokens) - 1, doc.ends)

    def _index(self, prompt: _Prompt, doc_id: int, end: int, ends: list[int]) -> None:
        at = (doc_id << _SHIFT) | end
        for n in range(self.min_n, len(ends) + 1):
            h = ends[n - 1]
            first = prompt.first[n - 1]
            seen = first.setdefault(h, at)
            if seen != at and (seen >> _SHIFT) != doc_id:
                prompt.second[n - 1].setdefault(h, at)

    def _evict(self, doc_id: int) -> None:
        doc = self._docs.pop(doc_id)
        if self._left.get(doc.req_id) == doc_id:
            del self._left[doc.req_id]
        prompt = self._prompts[doc.key]
        prompt.docs.remove(doc_id)
        if not prompt.docs:  # the prompt's own text goes with its last request
            del self._docs[prompt.doc], self._prompts[doc.key]
            return
        prompt.stale += len(doc.tokens) - len(doc.key)
        if prompt.stale > sum(len(self._docs[d].tokens) - len(doc.key) for d in prompt.docs):
            self._rebuild(prompt)

    def _rebuild(self, prompt: _Prompt) -> None:
        """Index the prompt's remaining texts afresh (amortised: only once evicted tokens outnumber the others)."""
        prompt.first = [{} for _ in range(self.max_n)]
        prompt.second = [{} for _ in range(self.max_n)]
        prompt.stale = 0
        for doc_id in [prompt.doc] + prompt.docs:
            doc, ends = self._docs[doc_id], []
            start = 0 if doc_id == prompt.doc else len(doc.key)
            for end, token in enumerate(doc.tokens):
                ends = self._roll(ends, token)
                if end >= start:
                    self._index(prompt, doc_id, end, ends)

    def stats(self) -> dict:
        """Sizes, for metrics and the memory bound: prompts, texts (running, finished) and indexed tokens (each
        prompt once, then the responses)."""
        response_tokens = sum(len(d.tokens) - len(d.key) for d in self._docs.values() if d.req_id is not None)
        return {"prompts": len(self._prompts), "running": len(self._live), "finished": len(self._finished),
                "tokens": sum(len(key) for key in self._prompts) + response_tokens}
