"""The recipe's group drafter (``ROLLOUT_SPECULATIVE=group``, ``recipe/drafting``) replayed on real sampled text as
vLLM would run it: its acceptance, next to the estimator's idealised figures, and its CPU cost per token.

Data: the same CodeT HumanEval samples as ``bench/acceptance.py`` (CodeGen-16B, T=0.8; not in the repository: pass
its path; the same tokenizer and groups). For each problem, the "earlier epoch" group (samples n+1..2n) runs first,
then the epoch's group (samples 1..n) with the earlier one finished in the corpus, both through one ``GroupCorpus``
as one engine holds it.

The replay is vLLM's loop for point-mass drafts: every request of a group starts together (the prefill step emits
its first token); after each step the corpus reads every request's new tokens, then proposes a draft for each
(``GroupProposer.propose``'s order); a draft's accepted prefix is its common prefix with the recorded response (the
law of vLLM's rejection sampler against an independent sample at the same temperature: issue 24), and the request
advances by that plus one. Siblings advance at their own pace, as in the engine, not in the estimator's lockstep.
What it leaves out: scheduling (all of a group's requests in every step; no preemption), other prompts' requests
in the batch (they never share a draft: separate indexes).

Cost: the corpus's wall time per response token (reading it and proposing after it, each prompt's one-off
indexing included) on this CPU, and its memory per token of the texts it holds (tracemalloc), at the match depth
the run uses, one request at a time (``observe``/``propose``). The engine calls the corpus once per step for the
whole batch (``GroupCorpus.step``): ``bench/group_drafter_cost.py`` measures that, by prompt length and text.

Reproduce: ``.venv/bin/python bench/group_drafter.py --data /tmp/acc_data/humaneval_codegen16B_t0.8.jsonl
--results bench/RESULTS.md`` (~4 min on 2 shared cores). The section goes between the ``group-drafter`` markers.
"""
from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from acceptance import SOURCE, load  # noqa: E402  (bench/acceptance.py: the data and its tokenizer)

from recipe.drafting.corpus import GroupCorpus  # noqa: E402
from recipe.report.sections import section_main  # noqa: E402
from recipe.sim.acceptance import estimate  # noqa: E402

MARK_START, MARK_END = "<!-- group-drafter:start -->", "<!-- group-drafter:end -->"
HEADING = "## The group drafter replayed on real sampled text (bench/group_drafter.py)"
K = 4


def replay(corpus: GroupCorpus, tag: str, prompt: np.ndarray, responses, k: int = K) -> tuple[int, int, float]:
    """Run one group through the corpus as vLLM would; (tokens, verify steps, seconds in the corpus)."""
    texts = [np.concatenate([prompt, r]) for r in responses]
    pos = [1] * len(texts)  # response tokens known: the prefill step emitted the first
    steps, spent = len(texts), 0.0
    ids = [f"{tag}-{i}" for i in range(len(texts))]
    while True:
        live = [i for i, r in enumerate(responses) if pos[i] < len(r)]
        if not live:
            break
        t0 = time.perf_counter()
        for i in live:
            corpus.observe(ids[i], texts[i][:len(prompt) + pos[i]], len(prompt))
        drafts = {i: corpus.propose(ids[i], k) for i in live}
        spent += time.perf_counter() - t0
        for i in live:
            rest = responses[i][pos[i]:]
            m = 0
            for d, t in zip(drafts[i], rest):
                if d != t:
                    break
                m += 1
            pos[i] = min(len(responses[i]), pos[i] + m + 1)
            steps += 1
    t0 = time.perf_counter()
    for i in range(len(texts)):
        corpus.observe(ids[i], texts[i], len(prompt))
        corpus.finish(ids[i])
    spent += time.perf_counter() - t0
    return sum(len(r) for r in responses), steps, spent


def bytes_per_token(groups, depth: int) -> float:
    """Memory per token of the texts held (each request's prompt and response, as the preflight's bound counts
    them; a prompt is indexed once however many requests share it)."""
    tracemalloc.start()
    corpus = GroupCorpus(k=K, max_n=depth, max_finished=1 << 30)
    base = tracemalloc.get_traced_memory()[0]
    held = 0
    for g in groups:
        for i, r in enumerate(g.responses):
            corpus.observe(f"{g.prompt_id}-{g.epoch}-{i}", np.concatenate([g.prompt, r]), len(g.prompt))
            held += len(g.prompt) + len(r)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / held


def section(args) -> str:
    groups, info = load(args.data, args.n, args.vocab, args.prompts)
    by_epoch = {e: [g for g in groups if g.epoch == e] for e in (0, 1)}
    lines = [f"Reproduce: `.venv/bin/python bench/group_drafter.py --data PATH --results bench/RESULTS.md` (data: "
             f"{SOURCE}). {info['prompts']} problems, groups of n={info['n']}, K={K}. Engine replay: the group drafter "
             "as vLLM runs it (siblings at their own pace; the earlier epoch's group finished first and kept). "
             "Estimator: `recipe.sim.acceptance` on the same responses (siblings in lockstep). Tokens per target "
             "step over all steps, prefill included; cost: the corpus's wall time per response token on this CPU "
             "(read + propose, each prompt's indexing included), memory per token of the texts held (prompt + "
             "response of each request).", "",
             "| depth | engine replay: own + group (first epoch) | engine replay: own + group + history | "
             "estimator: own + group | estimator: own + group + history | us per token | bytes per token |",
             "|---|---|---|---|---|---|---|"]
    for depth in args.depths:
        corpus = GroupCorpus(k=K, max_n=depth, max_finished=1 << 30)
        res = {}
        for epoch in (0, 1):
            tokens = steps = 0
            spent = 0.0
            for g in by_epoch[epoch]:
                t, s, sec = replay(corpus, f"{g.prompt_id}-{epoch}", g.prompt, g.responses)
                tokens, steps, spent = tokens + t, steps + s, spent + sec
            res[epoch] = (tokens / steps, spent / tokens)
        est_group = estimate(by_epoch[0], [f"suffix:own+group:k={K}:depth={depth}"], boot=200)  # replay's epoch 0
        est_all = estimate(groups, [f"suffix:own+group+history:k={K}:depth={depth}"], boot=200)
        eg, ea = (next(iter(e.values()))["tokens_per_step"] for e in (est_group, est_all))
        us = 1e6 * (res[0][1] + res[1][1]) / 2
        lines.append(f"| {depth} | {res[0][0]:.3f} | {res[1][0]:.3f} | {eg:.3f} | {ea:.3f} | {us:.1f} | "
                     f"{bytes_per_token(groups, depth):.0f} |")
    return "\n".join(lines)


def add_arguments(ap) -> None:
    ap.add_argument("--data", required=True, help="CodeT's HumanEval samples JSONL (bench/acceptance.py)")
    ap.add_argument("--n", type=int, default=16, help="samples per group")
    ap.add_argument("--prompts", type=int, help="first N problems (default: all)")
    ap.add_argument("--vocab", type=int, default=16000, help="BPE vocabulary")
    ap.add_argument("--depths", type=int, nargs="+", default=[8, 24], help="longest match (SUFFIX_DEPTH)")


def main(argv=None) -> int:
    return section_main(__doc__, section, MARK_START, MARK_END, HEADING, argv, add_arguments)


if __name__ == "__main__":
    sys.exit(main())
