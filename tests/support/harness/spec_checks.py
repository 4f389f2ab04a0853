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
