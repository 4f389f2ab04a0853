"""vLLM CPU's rejection sampler with point-mass drafts (ngram/suffix) emits the target distribution, with the recipe's
expand fix (recipe/cpu/vllm_plugin.py), at temperature != 1 and with top-p, for two kinds of request in one batch.

The sampler runs exactly as vLLM CPU runs it: ``apply_sampling_constraints`` (the per-token temperature and top-p that
the expand kernel spreads over the draft positions), then ``rejection_sample`` with the C++ kernels that
``CPUModelRunner._postprocess_triton`` installs. Each check is a chi-square goodness-of-fit test of the emitted tokens
against the target distribution over the cells the target can emit (cells it cannot emit must stay empty), with
N = 60,000 requests per kind. A check fails at p < 1e-4: a correct sampler fails one of the 5 checks with probability
< 5e-4 (with the fixed seed here the outcome is the same on every run). The same bound rejects a 5% temperature error.
"""
import types

import pytest
import torch

N, K, V = 60_000, 3, 8
ALPHA = 1e-4
LOGITS = torch.tensor([2.0, 1.3, 0.9, 0.4, 0.1, -0.3, -1.1, -2.0])
DRAFT = 2  # the point-mass draft token at every position
KINDS = {"a": (0.7, 1.0), "b": (1.3, 0.8)}  # temperature, top_p


def target(temperature: float, top_p: float) -> torch.Tensor:
    """The distribution vLLM samples from: softmax(logits / T), top-p as vLLM's pytorch path masks it (ascending
    sort, drop the tokens whose cumulative probability is <= 1 - top_p, never the most likely one)."""
    probs = torch.softmax(LOGITS / temperature, dim=-1)
    order = torch.argsort(probs)
    drop = probs[order].cumsum(0) <= 1 - top_p
    drop[-1] = False
    probs = probs.clone()
    probs[order[drop]] = 0
    return probs / probs.sum()


def chi_square_p(tokens: torch.Tensor, expected: torch.Tensor) -> float:
    """P-value of a chi-square goodness-of-fit test (df = support - 1); counts outside the support fail at once."""
    counts = torch.bincount(tokens.long(), minlength=V).double()
    support = expected > 0
    assert counts[~support].sum() == 0, f"tokens the target cannot emit: {counts.tolist()}"
    e = expected[support].double() * counts.sum()
    stat = ((counts[support] - e) ** 2 / e).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


@pytest.fixture
def cpu_rejection_sampler(monkeypatch):
    """vLLM's rejection sampler module with the CPU kernels bound as the CPU model runner binds them, the expand
    kernel and the recovered-token shim fixed by the recipe's plugin (restored afterwards)."""
    import vllm.utils.cpu_triton_utils as cpu_tl
    import vllm.v1.sample.rejection_sampler as rs

    from recipe.cpu import vllm_plugin

    monkeypatch.setattr(cpu_tl, "expand_kernel", cpu_tl.expand_kernel)
    monkeypatch.setattr(cpu_tl, "sample_recovered_tokens_kernel", cpu_tl.sample_recovered_tokens_kernel)
    vllm_plugin.fix_spec_expand_kernel()  # a no-op where this process's vLLM already loaded the plugin
    vllm_plugin.fix_spec_recovered_kernel()  # likewise: vLLM 0.24 passes USE_FP64_GUMBEL, the CPU shim lacks it
    assert getattr(cpu_tl.expand_kernel, vllm_plugin.MARK, False), "the expand fix is not in place"
    for name in ("rejection_greedy_sample_kernel", "rejection_random_sample_kernel", "expand_kernel",
                 "sample_recovered_tokens_kernel"):
        monkeypatch.setattr(rs, name, getattr(cpu_tl, name))
    return rs


def sample(rs, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """2N requests alternating kinds a, b, each with K point-mass drafts; returns (output tokens [2N, K+1], kinds)."""
    torch.manual_seed(seed)
    kind = torch.arange(2 * N) % 2  # 0: a, 1: b, interleaved so a misplaced expansion mixes them
    temperature = torch.tensor([KINDS["a"][0], KINDS["b"][0]])[kind].float()
    top_p = torch.tensor([KINDS["a"][1], KINDS["b"][1]])[kind].float()
    metadata = types.SimpleNamespace(all_greedy=False, all_random=True, generators={}, temperature=temperature,
                                     top_k=None, top_p=top_p)
    cu = torch.arange(1, 2 * N + 1, dtype=torch.int32) * K
    logits = rs.apply_sampling_constraints(LOGITS.repeat(2 * N * K, 1).contiguous(), cu, metadata)
    out = rs.rejection_sample(torch.full((2 * N * K,), DRAFT, dtype=torch.int32), [K] * (2 * N), K, cu, None, logits,
                              torch.full((2 * N, 1), V - 1, dtype=torch.int32), metadata)
    return out, kind


def test_point_mass_drafts_emit_the_target_distribution(cpu_rejection_sampler):
    out, kind = sample(cpu_rejection_sampler)
    p_values = {}
    for k, (temperature, top_p) in KINDS.items():
        rows = out[kind == (0 if k == "a" else 1)]
        expected = target(temperature, top_p)
        # position 0: every request emits a token there
        p_values[f"{k} pos0"] = chi_square_p(rows[:, 0], expected)
        # position 1, given position 0 accepted the draft: again the target (position 1 after a rejection is empty)
        accepted = rows[:, 0] == DRAFT
        p_values[f"{k} pos1|accepted"] = chi_square_p(rows[accepted, 1], expected)
        assert (rows[~accepted, 1] == -1).all()  # PLACEHOLDER_TOKEN_ID: nothing after a rejection
        acceptance = float(accepted.float().mean())
        sigma = float((expected[DRAFT] * (1 - expected[DRAFT]) / rows.shape[0]).sqrt())
        assert abs(acceptance - float(expected[DRAFT])) < 4.5 * sigma, (k, acceptance, float(expected[DRAFT]))
    # position 2 given two accepted drafts, kind a (b has too few for a tight test)
    rows = out[kind == 0]
    both = (rows[:, 0] == DRAFT) & (rows[:, 1] == DRAFT)
    p_values["a pos2|accepted"] = chi_square_p(rows[both, 2], target(*KINDS["a"]))
    print("chi-square p-values:", {k: round(p, 4) for k, p in p_values.items()})
    assert min(p_values.values()) > ALPHA, p_values


def test_the_bound_detects_a_small_temperature_error(cpu_rejection_sampler):
    """The same samples against a 5% wrong temperature: rejected, so the bound above has power."""
    out, kind = sample(cpu_rejection_sampler)
    temperature, top_p = KINDS["a"]
    assert chi_square_p(out[kind == 0, 0], target(temperature * 1.05, top_p)) < ALPHA
