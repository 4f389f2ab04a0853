"""Acceptance of model-free drafters on real sampled text (issue 24 item 4), and vLLM's ngram drafting time per step.

Data (not in the repository; pass its path): CodeT's HumanEval samples of CodeGen-16B at temperature 0.8, top-p
0.95, at most 300 tokens, 100 samples for each of the 164 problems (github.com/microsoft/CodeT,
``CodeT/data/generated_data/HumanEval_codegen16B_temp0.8_topp0.95_num100_max300_code_solution.jsonl``; one JSON object
per problem, ``{"prompt", "samples"}``). Fetch it with ``git show`` from a clone, e.g. to
``/tmp/acc_data/humaneval_codegen16B_t0.8.jsonl``.

Tokenizer: a byte-level BPE (``tokenizers``, 16k merges) trained on the file's own prompts and samples (seeded): no
pretrained tokenizer is on these machines; CodeGen's own has 50k tokens, Qwen3's 152k, so real tokens are longer and
fewer n-grams repeat token for token than here or about as many (a guess: the figure's direction is not known).

Groups: each problem's first ``--n`` samples are one GRPO group (epoch 1); the next ``--n`` samples the same prompt's
"earlier epoch" (epoch 0). That history comes from the same model, so it is an upper bound for RL, whose policy moves
between epochs. Drafters and their model: ``recipe/sim/acceptance.py``.

Drafting time: vLLM's own ``batch_propose_numba`` (one thread, as vLLM sets it) on B contexts of C random tokens,
the fastest of 7 calls: the CPU time of one ngram drafting step, which vLLM spends between two GPU steps
with async scheduling off.

Reproduce: ``.venv/bin/python bench/acceptance.py --data /tmp/acc_data/humaneval_codegen16B_t0.8.jsonl
--results bench/RESULTS.md`` (~2 min on 2 shared cores). The section goes between the ``acceptance`` markers.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.report.sections import section_main  # noqa: E402
from recipe.sim.acceptance import Group, estimate  # noqa: E402

SOURCE = ("CodeT (github.com/microsoft/CodeT), HumanEval_codegen16B_temp0.8_topp0.95_num100_max300_code_solution.jsonl"
          ": CodeGen-16B, T=0.8, top-p 0.95, <= 300 tokens")
MARK_START, MARK_END = "<!-- acceptance:start -->", "<!-- acceptance:end -->"
HEADING = "## Drafter acceptance on real sampled text (bench/acceptance.py)"
DRAFTERS = ("ngram:k=4:min=5:max=5", "ngram:k=4:min=1:max=3", "ngram:k=4:min=2:max=3", "suffix:own", "suffix:group",
            "suffix:history", "suffix:own+group", "suffix:own+history", "suffix:own+group+history")
BUCKETS = (0, 64, 128, 256)


def tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def load(path: str, n: int, vocab: int, prompts: int | None) -> tuple[list[Group], dict]:
    recs = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    for i, r in enumerate(recs):
        if "prompt" not in r or "samples" not in r:
            raise SystemExit(f"{path}:{i + 1}: want CodeT's {{'prompt', 'samples'}} records")
    recs = [r for r in recs if len(r["samples"]) >= 2 * n][:prompts]
    tok = tokenizer([r["prompt"] for r in recs] + [s for r in recs for s in r["samples"][:2 * n]], vocab)
    enc = lambda s: np.array(tok.encode(s).ids, np.int64)  # noqa: E731
    groups = []
    for i, r in enumerate(recs):
        prompt = enc(r["prompt"])
        for epoch, part in ((0, r["samples"][n:2 * n]), (1, r["samples"][:n])):
            resp = tuple(x for x in (enc(s) for s in part) if len(x))
            groups.append(Group(str(i), prompt, resp, epoch))
    lens = [len(x) for g in groups if g.epoch == 1 for x in g.responses]
    return groups, {"prompts": len(recs), "n": n, "mean_len": float(np.mean(lens)), "max_len": int(max(lens))}


def drafting_time(batches=(32, 128, 256), contexts=(2000, 8000), k: int = 4, lookup=(5, 5)) -> dict:
    """Seconds of vLLM's ngram proposer per step for B requests of C context tokens (fastest of 7 calls)."""
    from numba import set_num_threads

    from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba

    set_num_threads(1)
    rng = np.random.default_rng(0)
    out = {}
    for c in contexts:
        for b in batches:
            toks = rng.integers(0, 150_000, (b, c)).astype(np.int32)
            num = np.full(b, c, np.int32)
            draft, nd = np.zeros((b, k), np.int32), np.zeros(b, np.int32)
            reqs = list(range(b))
            batch_propose_numba(reqs, num, toks, lookup[0], lookup[1], c + 64, k, draft, nd)  # compile
            ts = []
            for _ in range(7):
                t0 = time.perf_counter()
                batch_propose_numba(reqs, num, toks, lookup[0], lookup[1], c + 64, k, draft, nd)
                ts.append(time.perf_counter() - t0)
            out[(b, c)] = float(np.min(ts))  # the least disturbed of the calls on a shared machine
    return out


def section(args) -> str:
    groups, info = load(args.data, args.n, args.vocab, args.prompts)
    only1 = [g for g in groups if g.epoch == 1]
    rep = estimate(only1, [d for d in DRAFTERS if "history" not in d], BUCKETS, boot=2000)
    rep.update({k: v for k, v in estimate(groups, [d for d in DRAFTERS if "history" in d], BUCKETS,
                                          boot=2000).items()})
    heads = [f"{b}-{BUCKETS[i + 1] if i + 1 < len(BUCKETS) else ''}" for i, b in enumerate(BUCKETS)]
    lines = [f"Reproduce: `.venv/bin/python bench/acceptance.py --data PATH --results bench/RESULTS.md` (data not in "
             f"the repository: {SOURCE}). {info['prompts']} problems, groups of n={info['n']} (samples 1-{info['n']}; "
             f"samples {info['n'] + 1}-{2 * info['n']} are the history), responses {info['mean_len']:.0f} tokens on "
             f"average (at most {info['max_len']}), byte-level BPE with {args.vocab} tokens trained on the file. "
             "Tokens per target step (the prefill step included), its 95% bootstrap interval over problems, the "
             "acceptance length over drafted steps (vLLM's `1 + accepted / drafts`) and tokens per step by the "
             "position where a step starts. `group`: siblings in lockstep (each known up to the same position); "
             "`history`: the other samples of the prompt, known in full (same model: an upper bound for RL).", "",
             "| drafter | tokens per step [95% CI] | acceptance length (drafted) | draft tokens accepted | "
             + " | ".join(f"pos {h}" for h in heads) + " |", "|---|---|---|---|" + "---|" * len(heads)]
    for name, s in rep.items():
        ci = s["tokens_per_step_ci"]
        rate = s["accepted"] / s["draft_tokens"] if s["draft_tokens"] else 0.0
        cells = " | ".join("-" if b["tokens_per_step"] is None else f"{b['tokens_per_step']:.3f}"
                           for b in s["by_position"])
        lines.append(f"| `{name}` | {s['tokens_per_step']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
                     f"{s['acceptance_length'] or 1.0:.3f} | {100 * rate:.1f}% | {cells} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"source": SOURCE, "info": info, "buckets": list(BUCKETS),
                                                   "drafters": rep}))
    dt = drafting_time()
    lines += ["", "vLLM's ngram drafting time per step on this CPU (one thread, K=4, lookup 5/5, random tokens: the "
              "KMP scan reads every context token; fastest of 7 calls). On these 2 shared cores it varies with the other "
              "jobs' load: 1.2-3 ns per context token in three runs; `recipe/sim/speculation.py` charges 1.3 ns, the "
              "least loaded run's (a server CPU core should be no slower):", "",
              "| requests | context 2000 | context 8000 |", "|---|---|---|"]
    for b in sorted({b for b, _ in dt}):
        lines.append(f"| {b} | {1e3 * dt[(b, 2000)]:.2f} ms | {1e3 * dt[(b, 8000)]:.2f} ms |")
    return "\n".join(lines)


def add_arguments(ap) -> None:
    ap.add_argument("--data", required=True, help="CodeT's HumanEval samples JSONL (see the module docstring)")
    ap.add_argument("--n", type=int, default=16, help="samples per group")
    ap.add_argument("--prompts", type=int, help="first N problems (default: all)")
    ap.add_argument("--vocab", type=int, default=16000, help="BPE vocabulary")
    ap.add_argument("--json-out", metavar="PATH", help="also write the estimator's report (for the simulator)")


def main(argv=None) -> int:
    return section_main(__doc__, section, MARK_START, MARK_END, HEADING, argv, add_arguments)


if __name__ == "__main__":
    sys.exit(main())
