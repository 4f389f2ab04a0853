"""The group drafter's CPU cost per emitted token and memory per token (``ROLLOUT_SPECULATIVE=group``,
``recipe/drafting/corpus.py``), called as vLLM calls it: one ``GroupCorpus.step`` per engine step for the whole batch.

Per text kind and prompt length: ``--groups`` GRPO groups of ``n`` requests (each group one prompt) in one batch,
8 x 16 = 128 requests by default (a replica's share of a 512-request step at 4 replicas), each emitting
``--response`` tokens, for ``--epochs`` epochs of the same prompts with ``max_finished`` one epoch's texts (so every
later epoch evicts the one before it while running: eviction and re-indexing are in the time). A request advances
by one token plus its draft's common prefix with its recorded continuation (vLLM's rejection sampler against the
recorded text). Texts: ``code`` (this Python's standard library sources), ``prose`` (the licence texts of
/usr/share/common-licenses), ``random`` (uniform token ids: every window distinct); word-level token ids. No math
reasoning text ships on this machine's registries (no dataset hub): the non-code figures are prose and random.
Siblings' responses are different slices of the text, so they share little: about one token per step, the most
steps per token, the dearest case for the per-step overhead.

Multi-turn: ``--groups`` root prompts (1,000 tokens) of ``n`` trajectories each, each turn a 500-token response and a 100-token tool
reply; each turn is a new vLLM request (``<trajectory>-<8 characters>``) whose prompt holds the whole history; cost
per token at 8 and 32 turns.

Cost: CPU seconds of the calling thread inside ``GroupCorpus.step`` per emitted token (CPU time, not wall time: the
machine is shared, and wall time moved 2-3x between runs) (prompt hashing, the group's one-off prompt
indexing, reading every token, drafting, eviction). Memory: the corpus's arrays (``stats()["bytes"]``) per token held
(each group's prompt once, then every text's own tokens), at the end of the first epoch, before any eviction (after
eviction, under a byte bound, and a re-index's costliest step: ``bench/group_corpus_bytes.py``).

Reproduce: ``.venv/bin/python bench/group_drafter_cost.py`` (~3 min on 2 shared cores; ``--response 2048`` for a
quick look).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.drafting.corpus import GroupCorpus  # noqa: E402

COMMAND = ".venv/bin/python bench/group_drafter_cost.py"
WORD = re.compile(r"\w+|[^\w\s]|\s+")


def words(paths) -> np.ndarray:
    vocab: dict[str, int] = {}
    ids = []
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        ids.extend(vocab.setdefault(w, len(vocab)) for w in WORD.findall(text))
    return np.array(ids, np.int32)


def texts(need: int) -> dict[str, np.ndarray]:
    lib = Path(re.__file__).parent
    code = words(sorted(lib.glob("*.py")))
    prose = words(sorted(Path("/usr/share/common-licenses").glob("*")))
    out = {"code": code, "prose": prose, "random": np.random.default_rng(0).integers(0, 150000, need, np.int32)}
    for kind, arr in out.items():
        if len(arr) < need:  # repeat (it only lengthens the text; a slice's windows stay the text's own)
            out[kind] = np.tile(arr, need // max(1, len(arr)) + 1)[:need]
    return out


def advance(lengths: np.ndarray, rows: np.ndarray, drafts, live: np.ndarray, total: int) -> None:
    """Each live row moves on by its draft's common prefix with its recorded continuation, plus one token."""
    for i in np.flatnonzero(live):
        m = 0
        for d in drafts[i]:
            if lengths[i] + m >= total or rows[i, lengths[i] + m] != d:
                break
            m += 1
        lengths[i] = min(total, lengths[i] + m + 1)


def run_batch(corpus: GroupCorpus, tag: str, rows: np.ndarray, prompt_len: int, k: int) -> tuple[int, float]:
    """One batch (every row a request) through the corpus as vLLM's loop runs it, until every request is done;
    (tokens emitted, CPU seconds in the corpus)."""
    n, total = rows.shape
    ids = [f"{tag}r{i}-{i:08d}" for i in range(n)]
    lengths = np.full(n, prompt_len + 1, np.int64)  # the prefill step emitted the first token
    prompt_lens = np.full(n, prompt_len, np.int64)
    spent = 0.0
    while (live := lengths < total).any():
        t0 = time.thread_time()
        drafts = corpus.step(ids, rows, lengths, prompt_lens, np.where(live, k, 0))
        spent += time.thread_time() - t0
        advance(lengths, rows, drafts, live, total)
    t0 = time.thread_time()
    corpus.step([], rows[:0], lengths[:0], prompt_lens[:0], lengths[:0])  # the batch leaves
    spent += time.thread_time() - t0
    return n * (total - prompt_len - 1), spent


def single_turn(text: np.ndarray, prompt_len: int, response: int, groups: int, n: int, epochs: int, depth: int,
                k: int, rng) -> tuple[float, float]:
    corpus = GroupCorpus(k=k, max_n=depth, max_finished=groups * n)
    prompts = [text[s:s + prompt_len] for s in rng.integers(0, len(text) - prompt_len, groups)]
    emitted, spent, bpt = 0, 0.0, 0.0
    for epoch in range(epochs):
        rows = np.empty((groups * n, prompt_len + response), np.int32)
        for i in range(groups * n):
            s = rng.integers(0, len(text) - response)
            rows[i, :prompt_len], rows[i, prompt_len:] = prompts[i // n], text[s:s + response]
        e, t = run_batch(corpus, f"e{epoch}", rows, prompt_len, k)
        emitted, spent = emitted + e, spent + t
        if epoch == 0:
            st = corpus.stats()
            bpt = st["bytes"] / st["tokens"]
    return 1e6 * spent / emitted, bpt


def multi_turn(text: np.ndarray, turns: int, groups: int, n: int, depth: int, k: int, rng, root_len: int = 1000,
               response: int = 500, reply: int = 100) -> float:
    """``groups`` root prompts with ``n`` trajectories each, all in one batch, turn after turn."""
    corpus = GroupCorpus(k=k, max_n=depth, max_finished=4 * groups * n)
    roots = [text[s:s + root_len] for s in rng.integers(0, len(text) - root_len, groups)]
    hist = [roots[i // n].copy() for i in range(groups * n)]
    emitted, spent = 0, 0.0
    for turn in range(turns):
        prompt_len = len(hist[0])
        total = prompt_len + response
        rows = np.empty((groups * n, total), np.int32)
        for i in range(groups * n):
            s = rng.integers(0, len(text) - response)
            rows[i, :prompt_len], rows[i, prompt_len:] = hist[i], text[s:s + response]
        ids = [f"traj{i}-{turn:08d}" for i in range(groups * n)]
        lengths = np.full(groups * n, prompt_len + 1, np.int64)
        plen = np.full(groups * n, prompt_len, np.int64)
        while (live := lengths < total).any():
            t0 = time.thread_time()
            drafts = corpus.step(ids, rows, lengths, plen, np.where(live, k, 0))
            spent += time.thread_time() - t0
            advance(lengths, rows, drafts, live, total)
        t0 = time.thread_time()
        corpus.step([], rows[:0], lengths[:0], plen[:0], lengths[:0])
        spent += time.thread_time() - t0
        emitted += groups * n * (response - 1)
        for i in range(groups * n):
            s = rng.integers(0, len(text) - reply)
            hist[i] = np.concatenate([rows[i], text[s:s + reply]])
    return 1e6 * spent / emitted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[250, 1000, 4000, 8000])
    ap.add_argument("--response", type=int, default=16384, help="tokens each request emits")
    ap.add_argument("--n", type=int, default=16, help="requests per group")
    ap.add_argument("--groups", type=int, default=8,
                    help="groups in one batch (8 x 16 = 128: a replica's share of a 512-request step at 4 replicas)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--depth", type=int, default=8, help="longest match (ROLLOUT_SPECULATIVE_SUFFIX_DEPTH)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens (ROLLOUT_SPECULATIVE_TOKENS)")
    ap.add_argument("--turns", type=int, nargs="+", default=[8, 32])
    args = ap.parse_args(argv)
    argv_text = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    print(f"Reproduce: `{COMMAND}{' ' + argv_text if argv_text else ''}`; {args.groups} groups of n={args.n} in one "
          f"batch, {args.response}-token responses, {args.epochs} epochs of the same prompts (max_finished = one "
          f"epoch's texts: eviction on), depth {args.depth}, K={args.k}; CPU time of the calling thread\n")
    kinds = texts(2 * max(args.prompts + [args.response]) + 1)
    single_turn(kinds["random"], 64, 256, 2, 4, 2, args.depth, args.k, np.random.default_rng(0))  # compile first
    print("| text | prompt tokens | us per emitted token | bytes per token held |")
    print("|---|---|---|---|")
    for kind, text in kinds.items():
        for L in args.prompts:
            us, bpt = single_turn(text, L, args.response, args.groups, args.n, args.epochs, args.depth, args.k,
                                  np.random.default_rng(L))
            print(f"| {kind} | {L} | {us:.2f} | {bpt:.0f} |", flush=True)
    print("\n| text | multi-turn: turns (1,000-token root, 500-token turns, 100-token replies) | us per emitted token |")
    print("|---|---|---|")
    for kind, text in kinds.items():
        for turns in args.turns:
            us = multi_turn(text, turns, args.groups, args.n, args.depth, args.k, np.random.default_rng(turns))
            print(f"| {kind} | {turns} | {us:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
