"""The group corpus's compiled kernels (``recipe/drafting/corpus.py`` holds the bookkeeping around them).

**Cost per token, whatever the prompt's or the history's length.** Each group holds numpy arrays: its texts' tokens
in order of arrival, each with the position of its text's next token, and one open-addressing table from a hash of
(window length, window) to the first position where that window ended and the first from another text. A text keeps
the rolling hashes of its last ``max_n`` windows, so reading a token costs at most ``max_n - min_n + 1`` table
probes (one for new text) and a draft one probe per indexed length plus one, then ``k`` linked reads: no step depends
on how long the prompt or the history is. Both run in numba-compiled kernels (numba ships with vLLM), one call per
group per engine step. arctic-inference's suffix trees (vLLM's ``suffix``) would be the maintained alternative, but
PyPI carries no binary wheel of it for CPython x86_64 (0.1.0-0.3.0 are source only, built with torch 2.7 and CUDA
kernels), and its cache keeps one global tree of every cached response, not one per group.

**Compiled once per node.** numba caches the machine code on disk (``cache=True``) in its cache directory: this
package's ``__pycache__`` where the checkout is writable, else numba's user-wide cache, or ``NUMBA_CACHE_DIR`` when
set (node-local disk is the one to name on a cluster). :func:`compile_once` takes a lock file there, so of the engines
that start together on a node one compiles (~2 CPU-s) and the rest load what it wrote.
"""
from __future__ import annotations

import fcntl
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from numba import njit

_B = np.uint64(0x100000001B3)  # the rolling hash's base (odd): windows hash mod 2^64
LOAD = 0.7  # the tables' largest fill before they double
# columns: pos (int32): token, next position of its text (-1: none yet), its text; tx (int64): a text's last position,
# context length (prompt included), first own position, evicted; ends (uint64): the text's last max_n window hashes,
# then the hash of its whole context; tab (uint64): key (0: empty), first + 1 | (second + 1) << 32
TOK, NXT, OWNER = 0, 1, 2
LAST, CLEN, START, DEAD, FREE = 0, 1, 2, 3, 4  # FREE: the text's next free position in its block (-1: none)
BLOCK = 32  # positions a text takes at a time: its tokens mostly contiguous, so a draft reads one cache line or two
_LO = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def mix(h, n):
    """A table key for the window hash ``h`` of length ``n`` (splitmix64; never 0, the empty slot)."""
    z = h ^ (np.uint64(n) * np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) | np.uint64(1)


@njit(cache=True, nogil=True)
def prefix_hashes(tokens, n):
    """The hashes of ``tokens[:i]`` for i = 0 .. n (a group's key is its prompt's; a text's, its whole context's)."""
    h = np.zeros(n + 1, np.uint64)
    for i in range(n):
        h[i + 1] = h[i] * _B + np.uint64(tokens[i] + 1)
    return h


@njit(cache=True, nogil=True)
def slot(tab, key):
    mask = len(tab) - 1
    i = np.int64(key & np.uint64(mask))
    while tab[i, 0] != 0 and tab[i, 0] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True, nogil=True)
def append(pos, tab, tx, ends, meta, d, t, min_n, max_n):
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
        key = mix(ends[d, n - 1], n)
        i = slot(tab, key)
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
def draft(pos, tab, tx, ends, d, k, min_n, max_n, out, slots):
    """Up to ``k`` tokens that followed the longest indexed occurrence of text ``d``'s end, into ``out``; their
    number (``slots``: scratch of ``max_n + 1``). A window is indexed only where its one-shorter suffix is, so the
    indexed lengths are ``min_n`` up to the first missing one: found going up, then from the longest down the first
    with a usable occurrence wins."""
    here = tx[d, LAST]
    top = min_n - 1
    for n in range(min_n, min(max_n, tx[d, CLEN]) + 1):
        i = slot(tab, mix(ends[d, n - 1], n))
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
def step(pos, tab, tx, ends, meta, job, tokens, lengths, want, out, out_len, min_n, max_n):
    """One engine step for one group: each text ``job[i, 0]`` reads row ``job[i, 1]``'s new tokens
    (``tokens[row, clen:lengths[row]]``), then drafts up to ``want[row]`` tokens (at most ``out``'s width) into
    ``out[row]``. Returns False,
    having read what fitted, when the arrays need to grow first (the caller grows them and calls again)."""
    per_token = max_n - min_n + 1
    slots = np.empty(max_n + 1, np.int64)
    for i in range(len(job)):
        d, r = job[i, 0], job[i, 1]
        for j in range(tx[d, CLEN], lengths[r]):
            if meta[0] + BLOCK > len(pos) or meta[1] + per_token > LOAD * len(tab):
                return False
            append(pos, tab, tx, ends, meta, d, tokens[r, j], min_n, max_n)
    for i in range(len(job)):
        d, r = job[i, 0], job[i, 1]
        k = min(want[r], out.shape[1])
        out_len[r] = draft(pos, tab, tx, ends, d, k, min_n, max_n, out[r], slots) if k > 0 else 0
    return True


@njit(cache=True, nogil=True)
def rehash(tab, new):
    for i in range(len(tab)):
        if tab[i, 0] != 0:
            j = slot(new, tab[i, 0])
            new[j, 0], new[j, 1] = tab[i, 0], tab[i, 1]


@njit(cache=True, nogil=True)
def walk(pos, start, out):
    """The tokens of a text from position ``start`` on, following its links, into ``out``; their number."""
    m, q = 0, start
    while q >= 0:
        out[m] = pos[q, TOK]
        m += 1
        q = pos[q, NXT]
    return m


@njit(cache=True, nogil=True)
def feed(pos, tab, tx, ends, meta, d, toks, min_n, max_n):
    """Text ``d`` reads ``toks`` in order (a re-index's chunk); how many it read before the arrays must grow."""
    per_token = max_n - min_n + 1
    for j in range(len(toks)):
        if meta[0] + BLOCK > len(pos) or meta[1] + per_token > LOAD * len(tab):
            return j
        append(pos, tab, tx, ends, meta, d, toks[j], min_n, max_n)
    return len(toks)


KERNELS = (mix, prefix_hashes, slot, append, draft, step, rehash, walk, feed)


def cache_dir() -> Path:
    """Where numba keeps these kernels' machine code on this node (see the module docstring)."""
    return Path(feed._cache.cache_path)


@contextmanager
def compile_once():
    """Hold the node's lock on the kernels' cache while warming them: one engine compiles, the others wait, then load.
    Yields a dict that gets ``seconds`` (wall time, the wait included), ``compiled`` (kernels compiled here, not
    loaded) and ``cache`` (the directory)."""
    where = cache_dir()
    out = {"cache": str(where)}
    t0 = time.perf_counter()
    try:
        where.mkdir(parents=True, exist_ok=True)
        lock = open(where / "recipe-drafting.lock", "w")
    except OSError:  # numba could not cache here either: each engine compiles
        lock = None
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        misses = sum(sum(k.stats.cache_misses.values()) for k in KERNELS)
        yield out
        out["compiled"] = sum(sum(k.stats.cache_misses.values()) for k in KERNELS) - misses
    finally:
        if lock is not None:
            lock.close()  # and with it the lock
    out["seconds"] = time.perf_counter() - t0
