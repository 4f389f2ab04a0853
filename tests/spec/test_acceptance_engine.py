"""The acceptance estimator (``recipe.sim.acceptance``) against vLLM CPU's own ngram counters, on the trained tiny
model at temperature 1 (with the recipe's plugin and its expand fix, as the other spec tests).

Prompts where drafts are often accepted: a countdown the conversation already holds (user asks, the assistant's
countdown, the user asks again), so the model's second countdown copies its first. ngram K=4, prompt lookup 1-3.
One engine with the recipe's batch-size schedule (``ROLLOUT_SPECULATIVE_MAX_BATCH=16``): waves of 16 requests draft,
waves of 64 do not (but in the first steps, before all 64 have arrived), so the same engine gives both arms (as
``test_spec_engine.py``); every response runs to ``MAX_TOKENS`` (``ignore_eos``), so a wave keeps its size.

- Exact: on the responses the drafting waves produced, the walk gives vLLM's counters: the same drafts and draft
  tokens, and the same accepted tokens except what a response's last step accepted past its end (vLLM counts those
  before it cuts the output at ``max_tokens``; the walk bounds them: ``slack``).
- Law: on the responses of the waves that did not draft (T=1 samples of the same law), the estimator's tokens per
  target step agrees with the drafting arm's, computed from vLLM's counters, within 3 standard errors of the two
  arms together (bootstrap over prompts).

Measured on 2 shared cores (~80 s, one engine start): vLLM 2215 drafts, 8700 draft tokens, 1586 accepted; the
walk 2215, 8700 and 1576 (+ at most 41 past the ends); the estimate on 128 undrafted responses 1.464 [1.420, 1.516]
tokens per step against the engine's 1.432-1.449 (z 0.42). With a deliberate off-by-one in the walk (drafting from
the context less its last token) both fail: the walk gives 3586 drafts and 14127 draft tokens against vLLM's 2211
and 8652, and the estimate falls to 1.04 (z = 69).
"""
import numpy as np
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.trained_model]

K, LOOKUP = 4, (1, 3)
MAX_BATCH, BIG = 16, 64
COUNTS = (12, 15, 17, 19, 21, 23, 26, 29)  # one prompt each
SPEC_SAMPLES, PLAIN_SAMPLES, MAX_TOKENS = 8, 16, 80
DRAFTER = f"ngram:k={K}:min={LOOKUP[0]}:max={LOOKUP[1]}"


@pytest.fixture(scope="module")
def sft_model():
    from recipe.tiny import sft as tiny_sft

    return tiny_sft.sft_artifacts().model_dir


@pytest.fixture(scope="module")
def prompts(sft_model):
    import random

    from transformers import AutoTokenizer

    from recipe.tiny import sft as tiny_sft, tasks as tiny_tasks

    tok = AutoTokenizer.from_pretrained(sft_model)
    rng = random.Random(0)
    out = []
    for n in COUNTS:
        conv = tiny_tasks.countdown_messages(n, rng) + [{"role": "user", "content": tiny_tasks.countdown_prompt(n)}]
        out.append(tiny_sft.prompt_ids(tok, conv))
    return out


@pytest.fixture(scope="module")
def engine(sft_model):
    from recipe.rollout_spec import batch_schedule
    from recipe.route_record.engine import InProcessVLLM

    eng = InProcessVLLM(sft_model, max_model_len=1024, max_num_seqs=BIG, seed=0, disable_log_stats=False,
                        speculative_config={"method": "ngram", "num_speculative_tokens": K,
                                            "prompt_lookup_min": LOOKUP[0], "prompt_lookup_max": LOOKUP[1],
                                            "num_speculative_tokens_per_batch_size": batch_schedule(K, MAX_BATCH, BIG)})
    yield eng
    eng.shutdown()


async def _sample(engine, prompt_list) -> list:
    """One response per prompt, all concurrent, at temperature 1, ``MAX_TOKENS`` each (past EOS too: a wave keeps its
    batch size to the end, so the big waves never fall under the schedule's limit and draft)."""
    import asyncio
    from uuid import uuid4

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    async def one(p):
        final = None
        async for final in engine.engine.generate(TokensPrompt(prompt_token_ids=list(p)),
                                                  SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0,
                                                                 ignore_eos=True), uuid4().hex):
            pass
        return list(final.outputs[0].token_ids)

    return await asyncio.gather(*(one(p) for p in prompt_list))


def generate(engine, prompts, samples: int, wave: int) -> list:
    """``samples`` responses per prompt in waves of ``wave`` concurrent requests, as groups by prompt."""
    from recipe.sim.acceptance import Group

    todo = [(i, p) for i, p in enumerate(prompts) for _ in range(samples)]
    got: dict[int, list] = {i: [] for i in range(len(prompts))}
    for s in range(0, len(todo), wave):
        chunk = todo[s:s + wave]
        for (i, _), r in zip(chunk, engine.run(_sample(engine, [p for _, p in chunk]))):
            got[i].append(r)
    return [Group(str(i), np.asarray(p), tuple(np.asarray(r) for r in got[i])) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def runs(engine, prompts):
    c = engine._counts
    plain = generate(engine, prompts, PLAIN_SAMPLES, BIG)
    # a big wave drafts only in its first steps, before all of its requests have arrived (lossless either way)
    assert c.draft_tokens < 0.02 * PLAIN_SAMPLES * len(prompts) * MAX_TOKENS, c.draft_tokens
    before = (c.drafts, c.draft_tokens, c.accepted)
    spec = generate(engine, prompts, SPEC_SAMPLES, MAX_BATCH)
    return plain, spec, {"drafts": c.drafts - before[0], "draft_tokens": c.draft_tokens - before[1],
                         "accepted": c.accepted - before[2]}


def _walks(groups):
    from recipe.sim.acceptance import Drafter, walk_groups

    return walk_groups(groups, [Drafter.parse(DRAFTER)])[Drafter.parse(DRAFTER).name]


def test_walk_reproduces_the_engine_counters(runs):
    _, spec, counters = runs
    walks = [w for _, ws in _walks(spec) for w in ws]
    drafts = sum(int((w.drafted > 0).sum()) for w in walks)
    draft_tokens = sum(int(w.drafted.sum()) for w in walks)
    accepted = sum(int(w.accepted.sum()) for w in walks)
    slack = _slack(walks)
    print(f"engine {counters}; walk drafts {drafts}, draft tokens {draft_tokens}, accepted {accepted} "
          f"(+ at most {slack} past the ends)")
    assert counters["accepted"] > 0.1 * counters["draft_tokens"], "too few acceptances for the test to have power"
    assert (counters["drafts"], counters["draft_tokens"]) == (drafts, draft_tokens)
    assert accepted <= counters["accepted"] <= accepted + slack


def _slack(walks) -> int:
    """What the last steps may have accepted past the responses' ends: a last step whose draft matched the response to
    its end may have accepted more (vLLM counts them before it cuts the output at ``max_tokens``)."""
    return sum(int(w.drafted[-1] - w.accepted[-1]) for w in walks if w.accepted[-1] == w.emitted[-1])


def test_estimate_on_undrafted_samples_matches_the_engine(runs):
    from recipe.sim.acceptance import summarize

    plain, spec, counters = runs
    est = summarize(_walks(plain), boot=4000)
    walked_spec = _walks(spec)
    tokens = sum(int(w.emitted.sum()) for _, ws in walked_spec for w in ws)
    slack = _slack([w for _, ws in walked_spec for w in ws])
    # vLLM's counters: tokens over request-steps, each step emitting 1 + its accepted tokens, less those past the end
    hi = tokens / (tokens - counters["accepted"])
    lo = tokens / (tokens - counters["accepted"] + slack)
    # the drafting arm's own sampling error, by the same bootstrap over prompts
    spread = summarize(walked_spec, boot=4000)["tokens_per_step_ci"]
    se = [(s[1] - s[0]) / (2 * 1.96) for s in (est["tokens_per_step_ci"], spread)]
    gap = max(lo - est["tokens_per_step"], est["tokens_per_step"] - hi, 0.0)
    z = gap / float(np.hypot(*se))
    print(f"estimate {est['tokens_per_step']:.4f} {est['tokens_per_step_ci']} on {est['responses']} undrafted "
          f"responses; engine [{lo:.4f}, {hi:.4f}] (se {se[1]:.4f}) on {tokens} tokens; z = {z:.2f}")
    assert z < 3.0
    assert lo > 1.3, "too few acceptances for the test to have power"
