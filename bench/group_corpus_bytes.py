"""The group corpus's memory per token after eviction, its byte bound, the longest step a re-index costs, and its
kernels' compile (``ROLLOUT_SPECULATIVE=group``, ``recipe/drafting/corpus.py``): the figures the preflight uses
(``recipe/preflight/rollout.py`` ``GROUP_BYTES_PER_TOKEN``) and the docs quote.

1. Bytes per token: ``--groups`` prompts of ``--n`` responses (``--response`` tokens at most, uniform from half of it),
   through ``GroupCorpus.step`` as vLLM calls it, for ``--epochs`` epochs of the same prompts; after every epoch
   from the second on (each prompt's history then replaced by its newest group: evicted texts, stale windows,
   re-indexes), the arrays' bytes (``stats()["bytes"]``: capacity included) and the bytes of the arrays reachable
   from the corpus (``recipe/drafting/live.py``), per token held; unbounded, and with a byte bound of half the
   unbounded corpus (eviction by bytes every epoch: the live bytes against the bound, after every epoch and at the
   worst step). Texts: ``math`` (synthetic worked
   arithmetic solutions, word-level: every response of a group solves its prompt's numbers by its own steps; no math
   dataset ships on this machine's registries), ``code`` (this Python's standard library), ``random`` (uniform ids:
   every window new, the most bytes per token).
2. Re-index stall: one group of ``--stall-n`` x twice ``--stall-response`` tokens replaced by its next epoch's
   group of ``--stall-n`` x ``--stall-response`` (finishing one request per step, then another prompt's request
   stepping on): once the evicted tokens outnumber the kept ones the group is re-indexed (~``--stall-n`` x
   ``--stall-response`` tokens); the CPU time of the costliest ``step`` call that did re-index work (the least of
   ``--repeats`` runs, each setting in a fresh process), with a whole-group re-index in one step (the corpus before
   issue 43) and with the default budget (``REBUILD_TOKENS`` per step plus the step's own tokens).
3. Kernels: the CPU seconds of ``warm_up()`` in a fresh process with an empty numba cache (the compile one engine
   per node pays) and with that cache filled (what every other engine pays).

Reproduce: ``.venv/bin/python bench/group_corpus_bytes.py`` (~3 min on 2 shared cores).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from group_drafter_cost import texts  # noqa: E402
from recipe.drafting.corpus import GroupCorpus, warm_up  # noqa: E402
from recipe.drafting.live import reachable_bytes  # noqa: E402

COMMAND = ".venv/bin/python bench/group_corpus_bytes.py"
WORDS = ["Let", "x", "be", "the", "number", ".", "Then", "=", "+", "-", "*", "/", "so", "we", "get", "Therefore",
         "answer", "is", "\\boxed{", "}", "Substituting", "gives", "Check", ":", "(", ")", "and", "both", "sides",
         "Multiply", "Divide", "by", "Subtract", "Add", ",", "which", "simplifies", "to", "First", "Next", "Finally"]


def math_response(rng, a: int, b: int, c: int, length: int) -> list[int]:
    """A worked solution of ``a x + b = c``-like steps, in its own order and numbers: word ids, then numbers."""
    vocab = {w: i for i, w in enumerate(WORDS)}
    num = lambda v: 1000 + int(v) % 100000  # noqa: E731  (a number is one token)
    out: list[int] = []
    x = c
    while len(out) < length:
        op = rng.integers(0, 4)
        y = int(rng.integers(1, 50))
        step = [vocab[rng.choice(["First", "Next", "Then", "Finally", "Substituting"])], vocab["x"], vocab["="],
                num(x), vocab[["+", "-", "*", "/"][op]], num(y), vocab["="]]
        x = [x + y, x - y, x * y, x // y][op] % 100000
        step += [num(x), vocab["."]]
        if rng.random() < 0.3:
            step += [vocab[w] for w in ("Check", ":", "(")] + [num(a), vocab["*"], num(b), vocab[")"], vocab["+"],
                                                              num(c), vocab["="], num(a * b + c), vocab["."]]
        out += step
    return out[:length - 4] + [vocab["\\boxed{"], num(x), vocab["}"], vocab["."]]


def responses(kind: str, text: np.ndarray | None, rng, n: int, length: int, seed_numbers) -> np.ndarray:
    if kind == "math":
        return np.array([math_response(rng, *seed_numbers, length) for _ in range(n)], np.int32)
    starts = rng.integers(0, len(text) - length, n)
    return np.stack([text[s:s + length] for s in starts]).astype(np.int32)


def run(corpus: GroupCorpus, kind: str, text, epochs: int, groups: int, n: int, response: int, prompt: int,
        per_batch: int, seed: int, chunk: int = 8):
    """Epochs of every prompt's group through ``corpus.step``; per epoch: (bytes/token, live bytes reachable from the
    corpus, tokens held, the most bytes its arrays held after any step)."""
    rng = np.random.default_rng(seed)
    heads = rng.integers(0, 50000, (groups, prompt), dtype=np.int32)
    numbers = rng.integers(2, 999, (groups, 3))
    out = []
    for epoch in range(epochs):
        worst = 0
        for b in range(0, groups, per_batch):
            g = range(b, min(groups, b + per_batch))
            rows = np.concatenate([np.concatenate([np.repeat(heads[i:i + 1], n, axis=0),
                                                   responses(kind, text, rng, n, response, numbers[i])], axis=1)
                                   for i in g])
            total = prompt + rng.integers(response // 2, response + 1, len(rows))
            ids = [f"e{epoch}g{b}r{i}" for i in range(len(rows))]
            end = prompt + 1
            while True:
                live = np.flatnonzero(total > end - chunk)
                if not len(live):
                    break
                corpus.step([ids[i] for i in live], np.ascontiguousarray(rows[live]),
                            np.minimum(end, total[live]).astype(np.int64), np.full(len(live), prompt, np.int64),
                            np.full(len(live), 4, np.int64))
                worst = max(worst, corpus.stats()["bytes"])
                end += chunk
            corpus.step([], rows[:0], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
        st = corpus.stats()
        out.append((st["bytes"] / st["tokens"], reachable_bytes(corpus), st["tokens"], worst))
    return out


def bytes_per_token(args) -> None:
    kinds = texts(4 * args.response)
    print("| text | epoch | bytes per token (arrays) | live bytes per token (reachable) | with a bound of half: "
          "live / bound after the epoch | arrays / bound, worst after any step |")
    print("|---|---|---|---|---|---|")
    for kind in ("math", "code", "random"):
        text = kinds.get(kind)
        free = run(GroupCorpus(k=4, max_n=args.depth, max_finished=10 ** 9), kind, text, args.epochs, args.groups,
                   args.n, args.response, args.prompt, args.per_batch, seed=1)
        bound = free[1][1] // 2
        held = run(GroupCorpus(k=4, max_n=args.depth, max_bytes=bound), kind, text, args.epochs, args.groups, args.n,
                   args.response, args.prompt, args.per_batch, seed=1)
        for e in range(1, args.epochs):
            bpt, live, tokens, _ = free[e]
            _, live_b, _, worst_b = held[e]
            print(f"| {kind} | {e + 1} | {bpt:.0f} | {live / tokens:.0f} | {live_b / bound:.3f} "
                  f"| {worst_b / bound:.3f} |", flush=True)


def stall(args) -> None:
    text = texts(8 * args.stall_response)["code"]
    if args.stall_setting is None:
        print(f"\n| re-index of a group of {args.stall_n} x {args.stall_response} tokens | costliest step with "
              "re-index work (CPU ms) | steps with re-index work | costliest other step (reads, finishes, growth) |")
        print("|---|---|---|---|")
    for label, budget in (("whole group in one step (before)", 10 ** 9), ("default budget (after)", None)):
        if args.stall_setting is None:  # each setting in a fresh process: the allocator's state left by one setting's
            # freed arrays moved the other's page faults by tens of ms
            keys = ("stall_n", "stall_response", "depth", "repeats")
            cmd = [sys.executable, __file__, "--stall-setting", label] + [
                f"--{k.replace('_', '-')}={getattr(args, k)}" for k in keys]
            print(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip(), flush=True)
            continue
        if label != args.stall_setting:
            continue
        warm_up()
        kw = {} if budget is None else {"rebuild_tokens": budget}
        runs = [costliest_steps(GroupCorpus(k=4, max_n=args.depth, **kw), text, args) for _ in range(args.repeats)]
        print(f"| {label} | {1e3 * min(r[0] for r in runs):.1f} | {runs[0][1]} | {1e3 * min(r[2] for r in runs):.1f} |",
              flush=True)


def costliest_steps(c: GroupCorpus, text: np.ndarray, args) -> tuple[float, int, float]:
    """The stall scenario: (the CPU time of the costliest ``step`` call that did re-index work, how many did, the
    costliest of the others). A step did re-index work if a re-index was in progress before or after it, or it
    replaced a group's arrays (a whole re-index inside the step)."""
    worst, busy, n = [0.0, 0.0], 0, args.stall_n

    def timed(*step_args):
        nonlocal busy
        before = (bool(c._rebuilds), {id(g) for g in c._groups.values()})
        t0 = time.thread_time()
        c.step(*step_args)
        dt = time.thread_time() - t0
        work = before[0] or bool(c._rebuilds) or bool(before[1] - {id(g) for g in c._groups.values()})
        busy += work
        worst[not work] = max(worst[not work], dt)

    rng = np.random.default_rng(0)
    head = rng.integers(0, 50000, (1, 256), dtype=np.int32)
    for epoch, length in enumerate((2 * args.stall_response, args.stall_response)):
        rows = np.concatenate([np.repeat(head, n, axis=0), responses("code", text, rng, n, length, None)], axis=1)
        ids = [f"e{epoch}r{i}" for i in range(n)]
        for end in range(257, rows.shape[1] + 64, 64):
            timed(ids, rows, np.full(n, min(end, rows.shape[1]), np.int64), np.full(n, 256, np.int64),
                  np.full(n, 4, np.int64))
        for i in range(1, n + 1):  # one leaves per step
            timed(ids[i:], rows[i:], np.full(n - i, rows.shape[1], np.int64), np.full(n - i, 256, np.int64),
                  np.zeros(n - i, np.int64))
    other = rng.integers(0, 50000, (1, 257), dtype=np.int32)  # another prompt's request: the engine steps on
    while c._rebuilds:
        timed(["other"], other, np.array([257], np.int64), np.array([256], np.int64), np.array([0], np.int64))
    return worst[0], busy, worst[1]


WARM = ("import resource; from recipe.drafting.corpus import warm_up; r0 = resource.getrusage(resource.RUSAGE_SELF); "
        "c = warm_up(); r1 = resource.getrusage(resource.RUSAGE_SELF); "
        "print(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, c['compiled'], c['cache'])")


def kernels() -> None:
    print("\n| numba kernels at engine start-up | CPU s (warm_up) | kernels compiled |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for label in ("empty cache (the node's first engine)", "filled cache (every other engine)"):
            out = subprocess.run([sys.executable, "-c", WARM], cwd=ROOT, env=env, capture_output=True, text=True,
                                 check=True).stdout.split()
            print(f"| {label} | {float(out[0]):.2f} | {out[1]} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--response", type=int, default=1000)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=8, help="groups in one batch")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--depth", type=int, default=8, help="longest match (ROLLOUT_SPECULATIVE_SUFFIX_DEPTH)")
    ap.add_argument("--stall-n", type=int, default=16)
    ap.add_argument("--stall-response", type=int, default=16384)
    ap.add_argument("--stall-setting", help=argparse.SUPPRESS)  # one row of the stall table (a child process)
    ap.add_argument("--repeats", type=int, default=3, help="stall runs per setting (the least costliest step: CPU "
                    "time on a shared machine moves with the other jobs' page faults and cache use)")
    args = ap.parse_args(argv)
    if args.stall_setting is not None:
        stall(args)
        return 0
    argv_text = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    print(f"Reproduce: `{COMMAND}{' ' + argv_text if argv_text else ''}`; {args.groups} prompts x n={args.n}, "
          f"responses of {args.response // 2}-{args.response} tokens after a {args.prompt}-token prompt, "
          f"{args.epochs} epochs, depth {args.depth}\n")
    kernels()
    warm_up()  # as an engine does before its first step: no compile or cache load inside a timed step
    bytes_per_token(args)
    stall(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
