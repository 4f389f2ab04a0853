"""The A/B report's drafter section (recipe/report/drafters.py): present only for a run that recorded its token ids
(RECORD_TOKENS=1, <run>/tokens), with the estimator's tokens per step for the shipped ngram and the group drafter's
sources, and bounded in the groups it reads."""
import gzip
import shutil
import zlib

import numpy as np
import pytest

from recipe.report import main
from recipe.report.drafters import MAX_GROUPS, sample_groups
from recipe.sim.acceptance import Drafter
from recipe.token_record import TokenRecorder

HEADING = "## Speculative drafters on the recorded responses"


def record(directory, prompts=3, epochs=2, n=4, length=120, seed=0):
    """GRPO groups whose siblings say the same thing after openings of different lengths (what group drafting feeds
    on: a sibling ahead in the text), the same text again each epoch (what history adds), random tokens otherwise."""
    rng = np.random.default_rng(seed)
    text = {p: rng.integers(0, 5000, length) for p in range(prompts)}
    rec = TokenRecorder(directory, max_bytes=10**7)
    step = 0
    for epoch in range(epochs):
        for p in range(prompts):
            step += 1
            responses = [np.concatenate([rng.integers(0, 5000, 15 * i), text[p]]) for i in range(n)]
            rec.record(step, epoch, rows=[p] * n, sample_index=list(range(n)), prompts=[[1, 2, 3]] * n,
                       responses=responses)


def test_section_only_for_runs_with_recordings(runs_dir, tmp_path):
    for name in ("baseline", "capped"):
        shutil.copytree(runs_dir / name, tmp_path / name)
    assert main([str(tmp_path / "baseline"), str(tmp_path / "capped"), "--out", str(tmp_path / "plain")]) == 0
    plain = (tmp_path / "plain" / "compare.md").read_text()
    assert HEADING not in plain

    record(tmp_path / "capped" / "tokens")
    assert main([str(tmp_path / "baseline"), str(tmp_path / "capped"), "--out", str(tmp_path / "spec")]) == 0
    report = (tmp_path / "spec" / "compare.md").read_text()
    section = report[report.index(HEADING):report.index("## Sources")]
    assert report.replace(section, "") == plain  # nothing else changes
    assert "### capped" in section and "### baseline" not in section
    assert f"at most {MAX_GROUPS} groups" in section
    for name in (Drafter().name, "suffix:own+group:k=4:depth=24:min=1", "suffix:own+group+history:k=4:depth=24:min=1"):
        assert f"| `{name}` | " in section, name
    # the request's own context never repeats; its siblings ahead of it do, and an earlier epoch holds all of it
    assert "Most tokens per target step: `suffix:own+group+history:k=4:depth=24:min=1`" in section
    ngram_row = next(line for line in section.splitlines() if line.startswith(f"| `{Drafter().name}` |"))
    assert float(ngram_row.split("|")[3].split()[0]) < 1.1


def test_sample_is_bounded_and_keeps_every_epoch_of_its_prompts(tmp_path):
    record(tmp_path, prompts=6, epochs=3)
    groups = sample_groups(tmp_path, max_groups=7)
    ids = {g.prompt_id for g in groups}
    smallest = sorted(map(str, range(6)), key=lambda p: (zlib.crc32(p.encode()), p))[:2]
    assert len(groups) == 6 and ids == set(smallest)  # two whole prompts of three epochs; a third would pass 7
    assert sorted((g.prompt_id, g.epoch) for g in groups) == sorted((p, e) for p in smallest for e in range(3))
    assert len(sample_groups(tmp_path)) == 18
    # the text bound: about two groups' worth keeps the smallest-hash prompt's earliest epochs only
    line = len(gzip.decompress((tmp_path / "step_000001.jsonl.gz").read_bytes()))
    by_bytes = sample_groups(tmp_path, max_groups=100, max_bytes=int(2.5 * line))
    assert [(g.prompt_id, g.epoch) for g in by_bytes] == [(smallest[0], 0), (smallest[0], 1)]


def test_the_engine_limits_come_from_the_runs_config():
    """n, batch, engines and the texts kept from the run's config; without the group-affinity router a group finds
    its prompt's previous engine only by chance (1 / engines)."""
    from types import SimpleNamespace

    from recipe.report.drafters import SPEC_KEY, run_limits

    values = {"actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 64, "trainer.nnodes": 2,
              "trainer.n_gpus_per_node": 8, "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
              f"{SPEC_KEY}.suffix_decoding_max_cached_requests": 5000,
              "actor_rollout_ref.rollout.router_config_path": "/x/configs/router/group_affinity.yaml"}
    from recipe.sim.corpus_limits import EngineLimits

    def run(traces=None):
        return SimpleNamespace(name="r", config=SimpleNamespace(values=values), traces=traces)

    lim = run_limits(run())
    # the group-affinity router: the share its model (recipe.sim.routing) keeps home at the run's own shape
    assert (lim.n, lim.batch, lim.engines, lim.kept) == (8, 64, 4, 5000)
    assert lim.home == pytest.approx(EngineLimits(n=8, batch=64, engines=4).home) and 0.25 < lim.home < 1
    values.pop("actor_rollout_ref.rollout.router_config_path")
    assert run_limits(run()).home == 0.25


def test_the_run_limits_read_the_corpus_byte_bound_and_the_traces_lengths():
    """The launch carries ROLLOUT_SPECULATIVE_CORPUS_GIB as a Ray environment variable (a string in the config):
    the run's bound, or the default where the config lacks it; the mean text from its traces' responses."""
    from types import SimpleNamespace

    import pandas as pd

    from recipe.drafting.bounds import DEFAULT_CORPUS_GIB, RAY_ENV_KEY
    from recipe.report.drafters import run_limits
    from recipe.sim.engine import EngineParams

    values = {"actor_rollout_ref.rollout.n": 16,
              "actor_rollout_ref.rollout.router_config_path": "/x/configs/router/group_affinity.yaml"}

    def run(traces=None):
        return SimpleNamespace(name="r", config=SimpleNamespace(values=values), traces=traces)

    default = run_limits(run())
    assert default.corpus_gib == DEFAULT_CORPUS_GIB and default.history_share > 0.9  # the default holds an epoch
    values[RAY_ENV_KEY] = "24"
    small = run_limits(run())
    assert small.corpus_gib == 24 and small.history_share < 0.1  # the users' scale: bytes bind
    values[RAY_ENV_KEY] = "96"
    big = run_limits(run())
    assert big.corpus_gib == 96 and big.kept_share == 1.0 and big.history_share > 0.9
    short = run_limits(run(pd.DataFrame({"response_length": [1000, 3000]})))
    assert short.text_tokens == 2000 + EngineParams.prompt_len and short.kept_texts > big.kept_texts
    values[RAY_ENV_KEY] = "lots"
    with pytest.raises(ValueError, match=f"{RAY_ENV_KEY}='lots'.*ROLLOUT_SPECULATIVE_CORPUS_GIB"):
        run_limits(run())
