"""What the speculative-decoding engine tests share: waves of identical requests, and a permutation test of two
samples' per-position token frequencies (is speculation changing what is sampled?)."""
from __future__ import annotations

import numpy as np


def waves(engine, size: int, prompt, n: int, length: int, temperature: float, **kw):
    out = []
    for _ in range(n // size):
        out += engine.run(engine.generate_forced([prompt] * size, [length] * size, temperature=temperature, **kw))
    return out


def sampled_after_first(outputs) -> np.ndarray:
    """Each response's tokens after its first (the prefill step's, which no draft can touch), one row each."""
    return np.array([r.outputs[0].token_ids for r in outputs])[:, 1:]


def mean_tv(a: np.ndarray, b: np.ndarray, vocab: int) -> float:
    """Mean over positions of the total-variation distance between the token frequencies of ``a`` and ``b``."""
    positions = a.shape[1]
    offsets = np.arange(positions) * vocab
    ca = np.bincount((a + offsets).ravel(), minlength=positions * vocab).reshape(positions, vocab) / len(a)
    cb = np.bincount((b + offsets).ravel(), minlength=positions * vocab).reshape(positions, vocab) / len(b)
    return float(0.5 * np.abs(ca - cb).sum(axis=1).mean())


def permutation_p(a: np.ndarray, b: np.ndarray, vocab: int, rounds: int, seed: int = 0) -> tuple[float, float, float]:
    """(statistic, mean of the null, p-value) of a permutation test of ``mean_tv`` between the two samples."""
    rng = np.random.default_rng(seed)
    observed = mean_tv(a, b, vocab)
    pooled = np.concatenate([a, b])
    null = []
    for _ in range(rounds):
        idx = rng.permutation(len(pooled))
        null.append(mean_tv(pooled[idx[:len(a)]], pooled[idx[len(a):]], vocab))
    null = np.array(null)
    return observed, float(null.mean()), float((1 + (null >= observed).sum()) / (rounds + 1))


VOCAB = 978  # the tiny tokenizer


def counted(engine, fn):
    """fn()'s result and the engine's (drafts, draft tokens, accepted tokens) during it."""
    c = engine._counts
    before = c.drafts, c.draft_tokens, c.accepted
    out = fn()
    return out, tuple(x - y for x, y in zip((c.drafts, c.draft_tokens, c.accepted), before))


def random_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` distinct random token ids of the tiny vocabulary (special ids left out)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.choice(np.arange(3, VOCAB), size=length, replace=False)] for _ in range(n)]


def same_distribution(spec, plain, wave: int, prompt, n: int, length: int, temperature: float, rounds: int):
    """Permutation test of ``spec``'s and ``plain``'s samples of ``prompt`` (``n`` responses of ``length``):
    ``(observed TV, null mean, p, (drafts, draft tokens, accepted))``; fails unless ``spec`` drafted and some
    drafts were accepted (else the test would not test speculation)."""
    out, counts = counted(spec, lambda: waves(spec, wave, prompt, n, length, temperature))
    base = waves(plain, 32, prompt, n, length, temperature)
    assert counts[1] > 0 and counts[2] > 0, counts
    a, b = sampled_after_first(out), sampled_after_first(base)
    assert a.shape == b.shape == (n, length - 1)
    return (*permutation_p(a, b, VOCAB, rounds), counts)


def teacher_forced_logprob_gaps(engine, prompt, wave: int, length: int) -> tuple[list[float], int]:
    """Sample ``wave`` responses at temperature 1 with their logprobs, and teacher-force the same tokens: the
    |difference| of each returned logprob from the forced ``prompt_logprobs``, and the draft tokens proposed."""
    out, (_, drafted, _) = counted(engine, lambda: waves(engine, wave, prompt, wave, length, 1.0, logprobs=0))
    forced = engine.run(engine.generate_forced([prompt + list(r.outputs[0].token_ids) for r in out],
                                               [1] * len(out), temperature=1.0, prompt_logprobs=0))
    diffs = [abs(r.outputs[0].logprobs[i][t].logprob - f.prompt_logprobs[len(prompt) + i][t].logprob)
             for r, f in zip(out, forced) for i, t in enumerate(r.outputs[0].token_ids)]
    return diffs, drafted
