"""``python -m recipe.sim.acceptance``: what a model-free drafter's speculation would accept, measured on recorded
responses instead of assumed.

Why a walk is enough: a drafter that proposes a point mass (ngram, suffix) is verified by vLLM's rejection sampler,
which accepts draft token i with probability p(d_i | context) and otherwise emits a sample of p with d_i masked out.
So a token is accepted exactly when the emitted token equals the draft, and the tokens a verify step emits are
distributed as the target model's. Walking a recorded temperature-T response r: at position t (t tokens emitted) the
drafter proposes d from what it could know then; m = the length of the common prefix of d and r[t:]; the step emits
m + 1 tokens (the accepted ones and the target's correction or bonus token); advance to t + m + 1. On a response the
engine itself produced with that drafter this reproduces the engine's draft and acceptance counters exactly (the
accepted prefix *is* that common prefix); on an independent sample at the same temperature it has the same law, so
the mean over recorded responses estimates the engine's tokens per target step (``tests/spec/
test_acceptance_engine.py`` checks both against vLLM CPU). The first token of a response comes from the prefill
step, which drafts nothing (vLLM proposes after a token is sampled): it counts as a step of one token.

Drafters (``Drafter.parse``; ``k`` the most tokens proposed per step):

- ``ngram[:k=4:min=1:max=3]``: vLLM's ``NgramProposer`` exactly (0.24's and 0.28's alike) (``vllm/v1/spec_decode/ngram_proposer.py``):
  over the request's own context (prompt + response so far), the longest n in [min, max] whose last n tokens occur
  earlier, at their *earliest* occurrence; it proposes the up to k tokens that followed it, cut at the context's end.
  The default is the recipe's shipped setting (``SHIPPED_NGRAM``: ``ROLLOUT_SPECULATIVE_TOKENS`` and
  ``ROLLOUT_SPECULATIVE_NGRAM_MIN/MAX``).
- ``suffix:SOURCES[:k=4:depth=24:min=1]``: the longest match (at most ``depth`` tokens) of the context's end in the
  sources, ``+``-joined: ``own`` (the request's context, as ngram with min..depth), ``group`` (the other responses
  of its GRPO group, prompt included, run in lockstep: when this response has t tokens each sibling is known up to
  its own token t, a finished one in full), ``history`` (the same prompt's responses from earlier epochs, all known).
  The longest match over the sources wins (ties: own, group, history; within a source the earliest occurrence, then
  the lowest sibling or earlier epoch); it proposes the up to k tokens that followed it, as far as they are known.
  This is a longest-match stand-in for arctic-inference's suffix trees, which choose among continuations by
  frequency and cap the draft by the match length: it shows where the repeats are, not that tree's exact drafts.

Input: JSONL (gzip if ``.gz``), one group per line, ``{"prompt_id", "epoch" (optional, default 0), "prompt": [ids],
"responses": [[ids], ...]}``, or the directory of ``step_*.jsonl.gz`` a ``RECORD_TOKENS=1`` training run writes
(``<run>/tokens``, ``recipe/token_record.py``), read in step order; a history source sees the groups of the same
``prompt_id`` at lower epochs, and drafters with ``history`` are reported over the groups that have one. Output:
tokens per target step (all steps, the prefill one included), the acceptance length over the drafted steps
(1 + accepted / drafts, what vLLM's counters give), and tokens per step by the position in the response where a
step starts, each with a bootstrap interval over prompts (a group's responses are correlated, so groups are the
unit resampled).

n-grams are compared by 64-bit random-coefficient hashes (a false match has probability ~2^-64 per comparison); the
match tables are numpy over every position at once, and only the walk itself is a Python loop over verify steps:
200 groups of 8 responses of 1000 tokens with the seven default drafters take ~1 minute on one shared core.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..token_record import step_files
from .corpus_limits import EngineLimits, engine_line

SOURCES = ("own", "group", "history")
SHIPPED_NGRAM = {"k": 4, "min": 1, "max": 3}  # recipe/preflight/knobs.py's ROLLOUT_SPECULATIVE_* defaults
BUCKETS = (0, 256, 1024, 4096)  # step start positions: [0, 256), [256, 1k), [1k, 4k), [4k, inf)
_COEF = np.random.default_rng(20240924).integers(1, 2**63, size=256, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


@dataclass(frozen=True)
class Group:
    """The responses of one prompt in one epoch (token ids)."""

    prompt_id: str
    prompt: np.ndarray
    responses: tuple
    epoch: int = 0


def record_lines(path: str | Path) -> Iterator[tuple[str, str]]:
    """(where, line) of every non-empty line of the input: a JSONL file, a gzip one (``.gz``) or a directory of
    ``step_*.jsonl.gz`` files (``RECORD_TOKENS=1``'s ``<run>/tokens``, ``recipe/token_record.py``), in step order."""
    path = Path(path)
    files = step_files(path) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: no step_*.jsonl.gz files (a RECORD_TOKENS=1 run writes them to <run>/tokens)")
    for file in files:
        no = 0
        try:
            with (gzip.open(file, "rt", encoding="utf-8") if file.suffix == ".gz" else open(file, encoding="utf-8")
                  ) as f:
                for no, line in enumerate(f, 1):
                    if line.strip():
                        yield f"{file}:{no}", line
        except (EOFError, gzip.BadGzipFile) as exc:  # a cut or foreign .gz: name it (EOFError is no OSError)
            raise ValueError(f"{file}:{no + 1}: unreadable gzip ({exc})") from None


def load_groups(path: str | Path) -> list[Group]:
    """Read the input (see the module docstring and ``record_lines``); a bad line names its file, its number and
    the key to fix."""
    out = []
    for where, line in record_lines(path):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
        out.append(group_from_record(rec, where))
    if not out:
        raise ValueError(f"{path}: no groups (want one JSON object per line with prompt_id, prompt, responses)")
    return out


def group_from_record(rec: dict, where: str = "record") -> Group:
    for key in ("prompt_id", "prompt", "responses"):
        if key not in rec:
            raise ValueError(f"{where}: missing key {key!r} (want prompt_id, prompt: [ids], responses: [[ids], ...])")
    responses = rec["responses"]
    if not isinstance(responses, list) or not responses:
        raise ValueError(f"{where}: 'responses' must be a non-empty list of token-id lists")
    try:
        resp = tuple(np.asarray(r, dtype=np.int64) for r in responses)
        prompt = np.asarray(rec["prompt"], dtype=np.int64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: 'prompt' and each response must be lists of integer token ids") from None
    if prompt.ndim != 1 or any(r.ndim != 1 for r in resp):
        raise ValueError(f"{where}: 'prompt' and each response must be flat lists of token ids")
    return Group(str(rec["prompt_id"]), prompt, resp, int(rec.get("epoch", 0)))


@dataclass(frozen=True)
class Drafter:
    """A drafter to walk: ``ngram`` (vLLM's proposer) or ``suffix`` over ``sources`` (see the module docstring)."""

    kind: str = "ngram"
    k: int = SHIPPED_NGRAM["k"]
    min_n: int = SHIPPED_NGRAM["min"]
    max_n: int = SHIPPED_NGRAM["max"]
    sources: tuple = ("own",)

    def __post_init__(self):
        if self.kind not in ("ngram", "suffix"):
            raise ValueError(f"drafter kind {self.kind!r}: want ngram or suffix")
        if self.kind == "ngram" and self.sources != ("own",):
            raise ValueError("ngram drafts from the request's own context only; use suffix:group|history for others")
        if not self.sources or any(s not in SOURCES for s in self.sources) or len(set(self.sources)) < len(
                self.sources):
            raise ValueError(f"drafter sources {self.sources}: want distinct names from {SOURCES}")
        if not 1 <= self.min_n <= self.max_n or self.k < 1 or self.max_n > len(_COEF):
            raise ValueError(f"drafter needs 1 <= min ({self.min_n}) <= max/depth ({self.max_n}) <= {len(_COEF)} "
                             f"and k ({self.k}) >= 1")

    @classmethod
    def parse(cls, spec: str) -> Drafter:
        """``ngram[:k=4:min=5:max=5]`` or ``suffix:own+group+history[:k=4:depth=24:min=1]``."""
        kind, *parts = spec.strip().split(":")
        kw: dict = {"kind": kind}
        if kind == "suffix":
            kw.update(k=SHIPPED_NGRAM["k"], min_n=1, max_n=24)
            if not parts or "=" in parts[0]:
                raise ValueError(f"drafter {spec!r}: suffix needs its sources, e.g. suffix:own+group")
            kw["sources"] = tuple(parts.pop(0).split("+"))
        names = {"k": "k", "min": "min_n", "max": "max_n", "depth": "max_n"}
        for part in parts:
            key, eq, value = part.partition("=")
            if not eq or key not in names or key == ("depth" if kind == "ngram" else "max"):
                raise ValueError(f"drafter {spec!r}: {part!r} is not one of k=, min=, "
                                 f"{'max=' if kind == 'ngram' else 'depth='} (colon-separated)")
            try:
                kw[names[key]] = int(value)
            except ValueError:
                raise ValueError(f"drafter {spec!r}: {key} must be an integer, got {value!r}") from None
        return cls(**kw)

    @property
    def name(self) -> str:
        if self.kind == "ngram":
            return f"ngram:k={self.k}:min={self.min_n}:max={self.max_n}"
        return f"suffix:{'+'.join(self.sources)}:k={self.k}:depth={self.max_n}:min={self.min_n}"


# -- match tables --------------------------------------------------------------------------------------------------
def _window_keys(big: np.ndarray, text_start: np.ndarray, depth: int) -> np.ndarray:
    """keys[n-1, e]: hash of the n tokens ending at ``big[e]``; 0 where that window crosses a text's start."""
    x = big.astype(np.uint64) + np.uint64(1)
    keys = np.zeros((depth, len(big)), np.uint64)
    acc = np.zeros(len(big), np.uint64)
    for n in range(1, depth + 1):
        shifted = np.zeros(len(big), np.uint64)
        if n <= len(big):
            shifted[n - 1:] = x[: len(big) - n + 1]
        acc = acc + shifted * _COEF[n - 1]
        keys[n - 1] = np.where(np.arange(len(big)) - n + 1 >= text_start, acc, np.uint64(0))
    return keys


@dataclass
class _GroupTexts:
    """A group's texts (prompt + response each, then the history's, earliest epoch first) in one array."""

    big: np.ndarray
    start: np.ndarray  # per text: offset in big
    length: np.ndarray  # per text: tokens
    prompt_len: int
    n_group: int  # texts 0 .. n_group-1 are the group's responses; the rest the history's
    text_of: np.ndarray = field(init=False)  # per position: its text

    def __post_init__(self):
        self.text_of = np.repeat(np.arange(len(self.start)), self.length)


def _texts(group: Group, history: Sequence[Group]) -> _GroupTexts:
    texts = [np.concatenate([group.prompt, r]) for r in group.responses]
    texts += [np.concatenate([h.prompt, r]) for h in history for r in h.responses]
    length = np.array([len(t) for t in texts], np.int64)
    start = np.concatenate([[0], np.cumsum(length)[:-1]])
    return _GroupTexts(np.concatenate(texts), start, length, len(group.prompt), len(group.responses))


def _starts(*cols: np.ndarray) -> np.ndarray:
    """True where a run of equal rows (over the sorted ``cols``) begins."""
    new = np.ones(len(cols[0]), bool)
    if len(new) > 1:
        new[1:] = np.any([c[1:] != c[:-1] for c in cols], axis=0)
    return new


def _first_per_key(keys: np.ndarray, pos: np.ndarray, rank: np.ndarray):
    """Sorted unique keys and, per key, the position with the smallest ``rank`` (ties: smaller position)."""
    order = np.lexsort((pos, rank, keys))
    k = keys[order]
    first = np.flatnonzero(_starts(k))
    return k[first], pos[order][first], order, first


def _lookup(table_keys: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    i = np.minimum(np.searchsorted(table_keys, query), max(len(table_keys) - 1, 0))
    hit = (table_keys[i] == query) if len(table_keys) else np.zeros(len(query), bool)
    return i, hit


class _Matches:
    """For every response of a group and every n <= depth: where each source's usable occurrence of the context's
    last n tokens starts its continuation (global index into ``big``, -1: none) and how many tokens of it are known,
    at every position t of the response. Computed once per group and shared by the drafters."""

    def __init__(self, g: _GroupTexts, depth: int, sources: set):
        self.g, self.depth = g, depth
        self._cache: dict = {}
        keys = _window_keys(g.big, np.repeat(g.start, g.length), depth)
        self.keys = keys
        pos = np.arange(len(g.big))
        in_group = g.text_of < g.n_group
        local = pos - g.start[g.text_of]
        not_last = local < g.length[g.text_of] - 1
        self.own_first = None
        if "own" in sources:  # per position: the earliest end of the same n-gram in the same text
            self.own_first = np.empty(keys.shape, np.int64)
            for n in range(depth):
                ok = in_group & (keys[n] != 0)
                idx = np.flatnonzero(ok)
                comb = keys[n][idx]
                order = np.lexsort((idx, g.text_of[idx], comb))
                ks, ts = comb[order], g.text_of[idx][order]
                new = _starts(ks, ts)
                out = np.full(len(g.big), -1, np.int64)
                out[idx[order]] = idx[order][new][np.cumsum(new) - 1]
                self.own_first[n] = out
        self.group_tab = self.hist_tab = None
        if "group" in sources:  # windows ending in a sibling's response, not on its last token
            self.group_tab = []
            sel_base = in_group & (local >= g.prompt_len) & not_last
            for n in range(depth):
                idx = np.flatnonzero(sel_base & (keys[n] != 0))
                kk, e1, order, first = _first_per_key(keys[n][idx], idx, local[idx])
                # the second-earliest occurrence in another text, for when the earliest is the querying response's
                t_sorted = g.text_of[idx[order]]
                grp = np.cumsum(np.isin(np.arange(len(order)), first)) - 1
                other = t_sorted != t_sorted[first][grp] if len(order) else np.zeros(0, bool)
                cand = np.where(other, np.arange(len(order)), len(order))
                second = np.minimum.reduceat(cand, first) if len(first) else np.zeros(0, np.int64)
                e2 = np.where(second < len(order), idx[order][np.minimum(second, len(order) - 1)], -1)
                self.group_tab.append((kk, e1, e2))
        if "history" in sources:
            self.hist_tab = []
            sel_base = ~in_group & (local >= g.prompt_len) & not_last
            for n in range(depth):
                idx = np.flatnonzero(sel_base & (keys[n] != 0))
                kk, e1, _, _ = _first_per_key(keys[n][idx], idx, local[idx] * len(g.start) + g.text_of[idx])
                self.hist_tab.append((kk, e1))

    def source(self, src: str, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(cont[n-1, t], known[n-1, t]) for response i at t = 0 .. R-1 (t = 0: the prefill step, no draft)."""
        if (src, i) not in self._cache:
            self._cache[(src, i)] = self._source(src, i)
        return self._cache[(src, i)]

    def _source(self, src: str, i: int) -> tuple[np.ndarray, np.ndarray]:
        g = self.g
        R = int(g.length[i]) - g.prompt_len
        t = np.arange(R)
        q = g.start[i] + g.prompt_len + t - 1  # the context's last token (t >= 1)
        cont = np.full((self.depth, R), -1, np.int64)
        known = np.zeros((self.depth, R), np.int64)
        if R <= 1:
            return cont, known
        tq, qq = t[1:], q[1:]
        for n in range(self.depth):
            key = self.keys[n][qq]
            valid = key != 0
            if src == "own":
                e = self.own_first[n][qq]
                ok = valid & (e >= 0) & (e < qq)
                c = e + 1
                kn = (qq + 1) - c
            elif src == "group":
                kk, e1, e2 = self.group_tab[n]
                j, hit = _lookup(kk, key)
                e = np.where(hit, e1[j] if len(kk) else 0, -1)
                mine = hit & (g.text_of[np.maximum(e, 0)] == i)
                e = np.where(mine, e2[j] if len(kk) else -1, e)
                te = g.text_of[np.maximum(e, 0)]
                local = e - g.start[te]
                ok = valid & (e >= 0) & (local < g.prompt_len + tq - 1)  # lockstep: sibling token t-1 is its last known
                c = e + 1
                kn = g.start[te] + np.minimum(g.prompt_len + tq, g.length[te]) - c
            else:
                kk, e1 = self.hist_tab[n]
                j, hit = _lookup(kk, key)
                e = np.where(hit, e1[j] if len(kk) else 0, -1)
                te = g.text_of[np.maximum(e, 0)]
                ok = valid & (e >= 0)
                c = e + 1
                kn = g.start[te] + g.length[te] - c
            cont[n, 1:] = np.where(ok, c, -1)
            known[n, 1:] = np.where(ok, kn, 0)
        return cont, known


# -- the walk ------------------------------------------------------------------------------------------------------
@dataclass
class Walk:
    """One response walked with one drafter: per verify step, where it starts, the tokens it emits (cut at the
    response's end), its draft length and the accepted draft tokens."""

    start: np.ndarray
    emitted: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray


def draft_table(m: _Matches, drafter: Drafter, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position t of response i: the global start of the drafter's proposal in ``big`` and its length (0: none)."""
    best_n = None
    for src in drafter.sources:
        cont, known = m.source(src, i)
        lo, hi = drafter.min_n - 1, drafter.max_n
        usable = cont[lo:hi] >= 0
        n_here = np.where(usable.any(0), hi - 1 - np.argmax(usable[::-1], axis=0), -1)  # longest usable n - 1
        cols = np.arange(cont.shape[1])
        c = np.where(n_here >= 0, cont[np.maximum(n_here, 0), cols], -1)
        kn = np.where(n_here >= 0, known[np.maximum(n_here, 0), cols], 0)
        if best_n is None:
            best_n, start, length = n_here, c, kn
        else:
            better = n_here > best_n  # ties keep the earlier source
            best_n, start, length = (np.where(better, n_here, best_n), np.where(better, c, start),
                                     np.where(better, kn, length))
    return start, np.clip(length, 0, drafter.k)


def walk_response(big: np.ndarray, response: np.ndarray, start: np.ndarray, length: np.ndarray, k: int) -> Walk:
    """Walk ``response`` given each position's proposal (``big[start[t]:start[t] + length[t]]``)."""
    R = len(response)
    j = np.arange(k)
    idx_d = np.clip(start[:, None] + j[None, :], 0, len(big) - 1)
    idx_r = np.minimum(np.arange(R)[:, None] + j[None, :], R - 1)
    live = (j[None, :] < length[:, None]) & (np.arange(R)[:, None] + j[None, :] < R)
    eq = live & (big[idx_d] == response[idx_r])
    matched = np.cumprod(eq, axis=1).sum(axis=1)  # common prefix of the draft and r[t:], inside the response
    steps, t = [], 0
    while t < R:
        steps.append(t)
        t += int(matched[t]) + 1
    s = np.array(steps, np.int64)
    ends = np.r_[s[1:], R]
    return Walk(start=s, emitted=ends - s, drafted=length[s], accepted=matched[s])


def walk_groups(groups: Sequence[Group], drafters: Sequence[Drafter]) -> dict[str, list]:
    """Walk every response of every group with each drafter: ``{drafter.name: [(group index, [Walk, ...]), ...]}``.
    Drafters that read ``history`` skip groups without an earlier epoch of their prompt."""
    by_prompt: dict[str, list[Group]] = {}
    for g in groups:
        by_prompt.setdefault(g.prompt_id, []).append(g)
    out: dict[str, list] = {d.name: [] for d in drafters}
    depth = max(d.max_n for d in drafters)
    for gi, g in enumerate(groups):
        history = sorted((h for h in by_prompt[g.prompt_id] if h.epoch < g.epoch), key=lambda h: h.epoch)
        use = [d for d in drafters if history or "history" not in d.sources]
        if not use:
            continue
        texts = _texts(g, history)
        m = _Matches(texts, depth, {s for d in use for s in d.sources})
        for d in use:
            walks = []
            for i, r in enumerate(g.responses):
                if len(r) == 0:
                    continue
                start, length = draft_table(m, d, i)
                walks.append(walk_response(texts.big, r, start, length, d.k))
            out[d.name].append((gi, walks))
    return out


# -- statistics ----------------------------------------------------------------------------------------------------
def _group_sums(walks: list[Walk], edges: np.ndarray) -> np.ndarray:
    """Per group: [tokens, steps, drafts, draft tokens, accepted, then tokens, steps and draft tokens per position
    bucket]."""
    s = np.concatenate([w.start for w in walks]) if walks else np.zeros(0, np.int64)
    em = np.concatenate([w.emitted for w in walks]) if walks else np.zeros(0, np.int64)
    dr = np.concatenate([w.drafted for w in walks]) if walks else np.zeros(0, np.int64)
    ac = np.concatenate([w.accepted for w in walks]) if walks else np.zeros(0, np.int64)
    b = np.searchsorted(edges, s, side="right") - 1
    nb = len(edges)
    return np.concatenate([[em.sum(), len(s), (dr > 0).sum(), dr.sum(), ac.sum()],
                           np.bincount(b, em, nb), np.bincount(b, minlength=nb), np.bincount(b, dr, nb)]
                          ).astype(np.float64)


def summarize(per_group: list[tuple[int, list[Walk]]], buckets: Sequence[int] = BUCKETS, *, boot: int = 2000,
              level: float = 0.95, seed: int = 0) -> dict:
    """Tokens per target step, acceptance length over drafted steps and tokens per step by bucket, each with a
    bootstrap interval over groups (percentile, ``level``)."""
    edges = np.asarray(buckets, np.int64)
    if not per_group:
        raise ValueError("no responses to summarise (a history drafter needs groups at a later epoch)")
    sums = np.stack([_group_sums(w, edges) for _, w in per_group])
    nb = len(edges)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(sums), np.full(len(sums), 1 / len(sums)), size=boot).astype(np.float64)
    boots = counts @ sums
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2

    def ratio(num, den, extra=0.0) -> dict:
        point = extra + sums[:, num].sum() / sums[:, den].sum() if sums[:, den].sum() else None
        with np.errstate(invalid="ignore", divide="ignore"):
            b = extra + boots[:, num] / boots[:, den]
        b = b[np.isfinite(b)]
        ci = [float(np.quantile(b, lo_q)), float(np.quantile(b, hi_q))] if len(b) and point is not None else None
        return {"value": None if point is None else round(float(point), 4),
                "ci": None if ci is None else [round(c, 4) for c in ci]}

    tot = sums.sum(0)
    by_bucket = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < nb else None
        r = ratio(5 + i, 5 + nb + i)
        steps = tot[5 + nb + i]
        by_bucket.append({"from": int(lo), "to": None if hi is None else int(hi), "steps": int(steps),
                          "tokens_per_step": r["value"], "ci": r["ci"],
                          "draft_tokens_per_step": round(float(tot[5 + 2 * nb + i] / steps), 4) if steps else None})
    tps = ratio(0, 1)
    alen = ratio(4, 2, extra=1.0)
    return {"groups": len(sums), "responses": sum(len(w) for _, w in per_group), "tokens": int(tot[0]),
            "steps": int(tot[1]), "drafts": int(tot[2]), "draft_tokens": int(tot[3]), "accepted": int(tot[4]),
            "tokens_per_step": tps["value"], "tokens_per_step_ci": tps["ci"],
            "acceptance_length": alen["value"], "acceptance_length_ci": alen["ci"], "by_position": by_bucket,
            "ci_level": level}


def estimate(groups: Sequence[Group], drafters: Iterable[Drafter | str], buckets: Sequence[int] = BUCKETS,
             **kw) -> dict:
    """``{drafter name: summary}`` (see ``summarize``) for each drafter over ``groups``; a history drafter without
    any group at a later epoch gets ``{"groups": 0, "skipped": why}``."""
    ds = [d if isinstance(d, Drafter) else Drafter.parse(d) for d in drafters]
    walked = walk_groups(groups, ds)
    return {d.name: summarize(walked[d.name], buckets, **kw) if walked[d.name] else
            {"groups": 0, "skipped": "no group has an earlier epoch of its prompt (history)"} for d in ds}


DEFAULT_DRAFTERS = ("ngram:k=4:min=5:max=5", "ngram", "suffix:own", "suffix:group", "suffix:history",
                    "suffix:own+group", "suffix:own+group+history")


def markdown(report: dict) -> str:
    first = next((s for s in report.values() if s["groups"]), None)
    if first is None:
        return "no drafter had responses to walk"

    heads = [f"{b['from']}-{'' if b['to'] is None else b['to']}" for b in first["by_position"]]
    lines = ["| drafter | groups | tokens per step [CI] | acceptance length (drafted steps) | draft tokens accepted | "
             + " | ".join(f"pos {h}" for h in heads) + " |", "|---|---|---|---|---|" + "---|" * len(heads)]
    for name, s in report.items():
        if not s["groups"]:
            lines.append(f"| `{name}` | 0 | {s['skipped']} |" + " |" * (2 + len(heads)))
            continue
        ci = s["tokens_per_step_ci"]
        rate = s["accepted"] / s["draft_tokens"] if s["draft_tokens"] else 0.0
        cells = " | ".join("-" if b["tokens_per_step"] is None else f"{b['tokens_per_step']:.3f}"
                           for b in s["by_position"])
        alen = "-" if s["acceptance_length"] is None else f"{s['acceptance_length']:.3f}"
        lines.append(f"| `{name}` | {s['groups']} | {s['tokens_per_step']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {alen} | "
                     f"{100 * rate:.1f}% | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.sim.acceptance", description=__doc__.splitlines()[0])
    ap.add_argument("path", help="JSONL (or .jsonl.gz): one group per line {prompt_id, epoch?, prompt: [ids], "
                    "responses: [[ids]]}; or a RECORD_TOKENS=1 run's tokens/ directory of step_*.jsonl.gz")
    ap.add_argument("--drafter", action="append", metavar="SPEC",
                    help=f"repeatable; default: {', '.join(DEFAULT_DRAFTERS)}")
    ap.add_argument("--buckets", default=",".join(map(str, BUCKETS)), help="step start positions, ascending from 0")
    ap.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples over groups")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    lim = EngineLimits()
    ap.add_argument("--engine", nargs=5, type=int, metavar=("PROMPTS", "N", "BATCH", "ENGINES", "KEPT"),
                    default=[lim.prompts, lim.n, lim.batch, lim.engines, lim.kept],
                    help="the run's scale for the group drafter's figure under the engine's limits "
                         "(recipe/sim/corpus_limits.py; default: the users' scale)")
    ap.add_argument("--corpus-gib", type=float, default=lim.corpus_gib,
                    help="ROLLOUT_SPECULATIVE_CORPUS_GIB: the group corpus's bytes per engine, the other bound on the "
                         "texts it keeps (at the users' mean text; recipe/sim/corpus_limits.py)")
    args = ap.parse_args(argv)
    try:
        limits = EngineLimits(*args.engine, corpus_gib=args.corpus_gib)
        drafters = [Drafter.parse(s) for s in (args.drafter or DEFAULT_DRAFTERS)]
        buckets = [int(b) for b in args.buckets.split(",")]
        if buckets[0] != 0 or any(b <= a for a, b in zip(buckets, buckets[1:])):
            raise ValueError(f"--buckets {args.buckets!r}: want ascending integers starting at 0")
        groups = load_groups(args.path)
        report = estimate(groups, drafters, buckets, boot=args.bootstrap)
    except (ValueError, OSError) as exc:
        print(f"python -m recipe.sim.acceptance: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print(markdown(report))
        line = engine_line(report, limits)
        if line:
            print(f"\n{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
