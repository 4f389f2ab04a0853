"""The group drafter's figure under the engine's limits (recipe/sim/corpus_limits.py): homes, the texts an engine
keeps, and when a prompt comes back."""
import numpy as np
import pytest

from recipe.drafting.bounds import CORPUS_GIB, DEFAULT_CORPUS_GIB
from recipe.preflight.rollout import GROUP_BYTES_PER_TOKEN
from recipe.sim.corpus_limits import USERS_TEXT_TOKENS, EngineLimits, engine_line, engine_tokens_per_step
from recipe.sim.routing import home_share

SAMPLES = 200000


def return_gaps(lim: EngineLimits, seed: int) -> np.ndarray:
    """Steps until a prompt comes back, sampled over two shuffled epochs (the model the share is solved from)."""
    rng = np.random.default_rng(seed)
    steps = lim.prompts / lim.batch
    return steps - rng.uniform(0, steps, SAMPLES) + rng.uniform(0, steps, SAMPLES)


def test_a_corpus_that_holds_one_group_per_home_prompt_keeps_every_history():
    lim = EngineLimits(corpus_gib=1024)  # 17,408 prompts x 16 over 4 engines: 69,632 texts an engine serves an epoch
    routed = home_share(17408, 16, 32, 4)["history"]  # the router's homes and guard (recipe/sim/routing.py)
    assert 0.9 < routed < 0.97
    assert lim.kept_share == 1.0 and lim.history_share == pytest.approx(routed, abs=1e-4)
    assert engine_tokens_per_step(2.0, 1.5, lim) == pytest.approx(lim.home * 2.0 + (1 - lim.home) * 1.5)


def test_an_engine_holds_more_steps_of_history_when_more_engines_share_a_step():
    """A step's batch x n texts are spread over the engines: 8 engines each finish half what 4 do, so the same
    ``kept`` holds twice the steps, and more of the prompts that come back (sampled as below)."""
    four, eight = EngineLimits(kept=10000, engines=4, home=1.0), EngineLimits(kept=10000, engines=8, home=1.0)
    assert four.history_steps == pytest.approx(10000 / (32 * 16 / 4))
    assert eight.history_steps == pytest.approx(2 * four.history_steps)
    rng = np.random.default_rng(1)
    steps = four.prompts / four.batch
    gap = steps - rng.uniform(0, steps, 200000) + rng.uniform(0, steps, 200000)
    for lim in (four, eight, EngineLimits(kept=10000, engines=2, home=1.0)):
        assert lim.kept_share == pytest.approx(np.mean(gap <= lim.history_steps), abs=0.005)


def test_a_smaller_corpus_keeps_the_prompts_that_come_back_soonest():
    """A prompt comes back after S - U1 + U2 steps of two shuffled epochs: the share kept, checked by sampling."""
    lim = EngineLimits(kept=10000, home=1.0)  # 78 of an epoch's 544 steps: ~1%
    rng = np.random.default_rng(0)
    steps = lim.prompts / lim.batch
    gap = steps - rng.uniform(0, steps, 200000) + rng.uniform(0, steps, 200000)
    for kept in (10000, 40000, 60000):
        lim = EngineLimits(kept=kept, home=1.0)
        assert lim.kept_share == pytest.approx(np.mean(gap <= lim.history_steps), abs=0.005)
    assert EngineLimits(kept=10000, home=0.25).history_share < 0.01  # the router before issue 34 (LRU, cleared)


def test_the_line_names_both_figures_and_needs_both_drafters():
    report = {"suffix:own+group:k=4:depth=8:min=1": {"tokens_per_step": 1.5},
              "suffix:own+group+history:k=4:depth=8:min=1": {"tokens_per_step": 2.0}}
    line = engine_line(report, EngineLimits())
    assert f"**{engine_tokens_per_step(2.0, 1.5, EngineLimits()):.3f}**" in line
    assert "2.000 with unlimited history" in line
    assert engine_line({"ngram:k=4:min=1:max=3": {"tokens_per_step": 1.3}}, EngineLimits()) == ""
    with pytest.raises(ValueError, match="engine limits"):
        EngineLimits(engines=0)
    with pytest.raises(ValueError, match="corpus_gib >= 0 .ROLLOUT_SPECULATIVE_CORPUS_GIB"):
        EngineLimits(corpus_gib=-1)


def test_the_byte_bound_keeps_a_fraction_of_an_epoch_at_the_users_scale():
    """24 GiB per engine at 224 B per token (the preflight's figure) holds ~18.6k texts of ~6.2k tokens, a quarter of
    the 69.6k an engine serves in an epoch: few prompts' previous group is still there when they come back; the
    default (96 GiB) holds the epoch."""
    lim = EngineLimits(corpus_gib=24)  # the users' scale, ROLLOUT_SPECULATIVE_SUFFIX_CACHED=80000
    assert lim.history_share < 0.1
    assert lim.text_tokens == USERS_TEXT_TOKENS
    assert lim.kept_texts == int(24 * 2**30 // (GROUP_BYTES_PER_TOKEN * USERS_TEXT_TOKENS)) < lim.kept
    assert lim.binding == CORPUS_GIB and f"{CORPUS_GIB} binds" in lim.bound_line
    assert lim.kept_share == pytest.approx(np.mean(return_gaps(lim, 2) <= lim.history_steps), abs=0.005)
    assert lim.history_share < EngineLimits(corpus_gib=1024).history_share / 10
    default = EngineLimits()
    assert default.corpus_gib == DEFAULT_CORPUS_GIB and default.history_share > 0.9 > 10 * lim.history_share
    longer = EngineLimits(corpus_gib=24, text_tokens=2 * USERS_TEXT_TOKENS)  # texts twice as long: half as many fit
    assert longer.kept_texts == pytest.approx(lim.kept_texts / 2, abs=1) and longer.history_share < lim.history_share


def test_a_larger_byte_bound_restores_the_history():
    """96 GiB per engine holds ~74.6k texts: an engine's epoch of home prompts fits, every routed-home prompt finds its
    previous group; between the two, the share grows with the bound."""
    shares = [EngineLimits(corpus_gib=g).history_share for g in (24, 48, 64, 96)]
    assert shares == sorted(shares) and len(set(shares)) == 4
    big = EngineLimits(corpus_gib=96)
    assert big.binding == CORPUS_GIB and big.kept_texts < big.kept  # still the byte bound, but enough
    assert big.kept_share == 1.0 and big.history_share == pytest.approx(big.home)


def test_the_count_bound_binds_where_it_keeps_fewer_texts():
    for gib in (DEFAULT_CORPUS_GIB, 96):
        lim = EngineLimits(kept=10000, corpus_gib=gib, home=1.0)  # 10,000 < the ~18.6k texts 24 GiB holds
        assert lim.binding == "ROLLOUT_SPECULATIVE_SUFFIX_CACHED" and lim.kept_texts == 10000
        assert lim.kept_share == pytest.approx(np.mean(return_gaps(lim, 3) <= lim.history_steps), abs=0.005)
    assert EngineLimits(kept=0, corpus_gib=96).history_share == 0.0
    assert EngineLimits(corpus_gib=0).history_share == 0.0  # a bound of 0 keeps no finished text


def test_the_simulator_reads_the_bound_and_the_traces_mean_text():
    """``python -m recipe.sim --corpus-gib``: the history drafter's curve is mixed at the share the byte bound leaves at
    the trace's own mean text, and its source says which bound binds."""
    from recipe.sim import trace as T
    from recipe.sim.__main__ import build_parser, engine_params, spec_cost, trace_limits

    trace = T.generate(num_prompts=256, epochs=2)
    argv = ["--acceptance-curve", "recipe/sim/curves/code-humaneval-codet.json",
            "--drafter", "suffix:own+group+history:k=4:depth=8:min=1"]
    wide, narrow = (build_parser().parse_args([*argv, "--corpus-gib", g]) for g in ("24", "0.25"))
    engine, _ = engine_params(wide)
    lw, ln = trace_limits(trace, wide, engine), trace_limits(trace, narrow, engine)
    assert lw.text_tokens == pytest.approx(trace.lengths.mean() + engine.prompt_len)
    assert lw.kept_share == 1.0  # 24 GiB holds the 1,024 texts an engine serves in an epoch, 0.25 GiB ~190
    assert ln.binding == CORPUS_GIB and ln.kept_texts < 1024 and ln.history_share < lw.history_share
    cw, cn = spec_cost(wide, lw), spec_cost(narrow, ln)
    assert cn.curve.tau[0] < cw.curve.tau[0]
    assert f"{CORPUS_GIB} binds" in cn.curve.source and f"{ln.history_share:.1%} of the responses" in cn.curve.source
    with pytest.raises(SystemExit, match="--corpus-gib -1.*ROLLOUT_SPECULATIVE_CORPUS_GIB"):
        trace_limits(trace, build_parser().parse_args([*argv, "--corpus-gib", "-1"]), engine)


def test_the_estimator_cli_refuses_a_negative_bound(capsys):
    from recipe.sim.acceptance import main

    assert main(["unused.jsonl", "--corpus-gib", "-1"]) == 2
    assert "corpus_gib >= 0 (ROLLOUT_SPECULATIVE_CORPUS_GIB)" in capsys.readouterr().err
