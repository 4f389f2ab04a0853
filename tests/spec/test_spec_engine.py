"""On vLLM's real CPU engine (the tiny Qwen3-MoE, with the recipe's plugin and its expand fix): ngram speculation does
not change what is sampled, and the logprobs it returns are the target model's.

One engine, with the recipe's batch-size schedule (``ROLLOUT_SPECULATIVE_MAX_BATCH=16``): waves of 16 concurrent
requests speculate (K=4), waves of 64 do not (the schedule's K=0 above 16), so the same engine gives both arms and the
scheduler's draft counters show which arm drafted.

- Distribution: 512 responses of 16 tokens per arm at temperature 0.03 on a repetitive prompt (prompt lookup drafts
  from the first step, and the low temperature makes accepted drafts common). Statistic: the mean over positions 1-15
  of the total-variation distance between the arms' token frequencies; p-value from 1000 random relabellings of the
  pooled responses. The test fails at p <= 0.001, i.e. a correct sampler fails it with probability ~0.001 (responses
  are i.i.d. within each arm under the null). Measured on 2 cores: with the fix p = 0.825 (mean TV 0.097 vs null
  0.102; 12.3% of draft tokens accepted); with it off (RECIPE_VLLM_CPU_EXPAND_FIX=0 in the environment) p = 0.001, the
  smallest possible (TV 0.200 vs null 0.151; 2.0% accepted), so the test fails as it should.
- Logprobs: 16 responses at temperature 1 with verl's ``logprobs_mode=processed_logprobs``, on a prompt that holds half
  the vocabulary (so nearly every step drafts); each returned logprob equals the teacher-forced ``prompt_logprobs`` of
  the same tokens (processed = raw at temperature 1 without top-p/k). Measured: max |diff| 4.8e-7 over 384 tokens with
  the fix, 7.7 without it (the processed logprobs divide by the same uninitialised temperatures).
One engine start (~40-60 s) and both tests: ~65 s on 2 cores.
"""
import numpy as np
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MAX_BATCH, K, LENGTH, N = 16, 4, 16, 512
TEMPERATURE, ALPHA, PERMUTATIONS = 0.03, 0.001, 1000
PROMPT = [5, 6, 7, 8] * 16


@pytest.fixture(scope="module")
def spec_engine(tiny_artifacts):
    from recipe.testing.vllm_engine import InProcessVLLM, _SchedulerCounts

    class Counts(_SchedulerCounts):
        """Also sums the scheduler's speculative-decoding counters."""

        def __init__(self, vllm_config, engine_index=0):
            super().__init__(vllm_config, engine_index)
            self.drafts = self.draft_tokens = self.accepted = 0

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            super().record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None:
                self.drafts += spec.num_drafts
                self.draft_tokens += spec.num_draft_tokens
                self.accepted += spec.num_accepted_tokens

    class Engine(InProcessVLLM):
        async def _start(self, args):
            from vllm.v1.engine.async_llm import AsyncLLM

            def counts(vllm_config, engine_index=0):
                self._counts = Counts(vllm_config, engine_index)
                return self._counts

            return AsyncLLM.from_engine_args(args, stat_loggers=[counts])

    from recipe.rollout_spec import batch_schedule

    engine = Engine(tiny_artifacts.model_dir, max_model_len=1024, max_num_seqs=64, seed=0, disable_log_stats=False,
                    logprobs_mode="processed_logprobs",  # verl's setting
                    speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1,
                                        "prompt_lookup_max": 3,
                                        "num_speculative_tokens_per_batch_size": batch_schedule(K, MAX_BATCH, 64)})
    yield engine
    engine.shutdown()


def waves(engine, size: int, prompt, n: int, length: int, temperature: float, **kw):
    out = []
    for _ in range(n // size):
        out += engine.run(engine.generate_forced([prompt] * size, [length] * size, temperature=temperature, **kw))
    return out


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


def test_ngram_speculation_samples_the_same_distribution(spec_engine):
    vocab = 978  # the tiny tokenizer
    counts = spec_engine._counts
    base = waves(spec_engine, 64, PROMPT, N, LENGTH, TEMPERATURE)  # first: the counters start at 0
    assert counts.steps > 0 and counts.drafts == 0, "the schedule drafted above ROLLOUT_SPECULATIVE_MAX_BATCH"
    spec = waves(spec_engine, MAX_BATCH, PROMPT, N, LENGTH, TEMPERATURE)
    drafted, accepted, drafts = counts.draft_tokens, counts.accepted, counts.drafts
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    a = np.array([r.outputs[0].token_ids for r in spec])[:, 1:]
    b = np.array([r.outputs[0].token_ids for r in base])[:, 1:]
    assert a.shape == b.shape == (N, LENGTH - 1)
    observed, null_mean, p = permutation_p(a, b, vocab, PERMUTATIONS)
    print(f"ngram K={K}: {drafts} drafts, {drafted} draft tokens, {accepted} accepted "
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
