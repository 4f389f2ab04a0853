"""The group corpus's byte bound from the launcher to the engine, and the preflight's figure for it: the rollout
nodes' memory (recipe/preflight/nodes.py), the measured bytes per token (recipe/preflight/rollout.py), the engine's
start-up line (recipe/drafting/vllm_proposer.py)."""
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from recipe.core.routing_cost import fmt_bytes
from recipe.drafting import vllm_proposer
from recipe.drafting.bounds import CORPUS_GIB, DEFAULT_CORPUS_GIB, RAY_ENV_KEY
from recipe.drafting.corpus import GroupCorpus
from recipe.preflight import nodes, rollout
from recipe.preflight.knobs import KNOBS
from recipe.rollout_spec import GROUP_PROPOSER, KEY

GIB = 2**30


def cfg(cached=80000, gib=None, prompt=1024, response=16384, seqs=256, tp=4, gpus=8):
    out = {"actor_rollout_ref": {"rollout": {
        "max_num_seqs": seqs, "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1, "n": 16,
        "engine_kwargs": {"vllm": {"speculative_config": {
            "model": GROUP_PROPOSER, "suffix_decoding_max_cached_requests": cached}}}}},
        "data": {"max_prompt_length": prompt, "max_response_length": response, "train_batch_size": 512},
        "trainer": {"n_gpus_per_node": gpus, "nnodes": 2}}
    if gib is not None:
        out["ray_kwargs"] = {"ray_init": {"runtime_env": {"env_vars": {CORPUS_GIB: str(gib)}}}}
    return out


def check(c, launcher, monkeypatch, address=None, query=None):
    """group_drafter_memory's errors and notes, the launcher's memory ``launcher``, RAY_ADDRESS ``address``."""
    monkeypatch.setattr(nodes, "CLUSTER_FILE", nodes.Path("/nonexistent/ray_current_cluster"))
    if address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setattr(nodes, "ray_gpu_node_memory", query)
    errors, notes = [], []
    rollout.group_drafter_memory(c, errors, notes, launcher)
    return errors, notes


def test_the_rollout_nodes_memory_is_checked_not_the_launchers(monkeypatch):
    """A launcher with RAY_ADDRESS is not where the engines run: Ray's view of the GPU nodes is what counts, and the
    message says which memory it checked."""
    asked = []
    small = lambda address: asked.append(address) or [100 * GIB, 96 * GIB]  # noqa: E731
    errors, notes = check(cfg(), 4096 * GIB, monkeypatch, "10.0.0.1:6379", small)
    assert asked == ["10.0.0.1:6379"]
    assert errors and "GPU node(s) in the Ray cluster at 10.0.0.1:6379" in errors[0] and "103 GB" in errors[0], errors
    errors, notes = check(cfg(), 4096 * GIB, monkeypatch)  # no cluster: the launcher is the rollout node
    assert not errors and "checked against this machine's memory" in notes[0], notes


def test_an_unreadable_cluster_is_said_not_checked(monkeypatch):
    def down(address):
        raise RuntimeError("no answer in 60 s")
    errors, notes = check(cfg(), 1 * GIB, monkeypatch, "auto", down)
    assert not errors and "not checked" in notes[0] and "no answer in 60 s" in notes[0], notes


def test_the_figure_is_the_byte_bound_per_engine_times_the_engines_at_the_measured_bytes_per_token(monkeypatch):
    """Users' shapes (17k-token texts, 80,000 kept): the byte bound binds, per engine, x 2 engines a node; a small
    history binds below it, at the measured bytes per token; the running texts are never evicted."""
    errors, notes = check(cfg(gib=10), 4096 * GIB, monkeypatch)
    assert "keeps up to 21.5 GB of drafting corpus per node (2 engines x 10.7 GB" in notes[0], notes
    assert f"{CORPUS_GIB} binds" in notes[0]
    errors, notes = check(cfg(cached=100, prompt=100, response=900, seqs=28), 4096 * GIB, monkeypatch)
    per_engine = (100 + 28) * 1000 * rollout.GROUP_BYTES_PER_TOKEN
    assert f"2 engines x {fmt_bytes(per_engine)}" in notes[0], notes
    errors, notes = check(cfg(gib=0.001), 4096 * GIB, monkeypatch)
    running = 256 * (1024 + 16384) * rollout.GROUP_BYTES_PER_TOKEN
    assert f"2 engines x {fmt_bytes(running)}" in notes[0], notes
    errors, _ = check(cfg(), 64 * GIB, monkeypatch)
    assert errors and f"lower {CORPUS_GIB}" in errors[0], errors


def test_the_bytes_per_token_covers_the_corpus_after_eviction():
    """The preflight's figure per token is at least what the corpus holds after epochs of eviction on random ids
    (every window new): the 72 B it assumed before was short of it."""
    rng = np.random.default_rng(0)
    c = GroupCorpus(k=4, max_n=8)
    heads = rng.integers(0, 50000, (8, 100), dtype=np.int32)
    worst = 0.0
    for epoch in range(3):
        rows = np.concatenate([np.repeat(heads, 16, axis=0), rng.integers(0, 50000, (128, 600), dtype=np.int32)], 1)
        total = rng.integers(400, 701, 128)
        ids = [f"e{epoch}r{i}" for i in range(128)]
        for end in range(101, 701 + 16, 16):
            live = np.flatnonzero(total > end - 16)
            c.step([ids[i] for i in live], np.ascontiguousarray(rows[live]), np.minimum(end, total[live]),
                   np.full(len(live), 100), np.full(len(live), 4))
        c.step([], rows[:0], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
        if epoch:
            worst = max(worst, c.stats()["bytes"] / c.stats()["tokens"])
    assert 72 < worst <= rollout.GROUP_BYTES_PER_TOKEN, worst


def test_the_engine_reads_its_bound_warms_its_kernels_and_says_what_a_restart_loses(monkeypatch, caplog):
    monkeypatch.setattr(vllm_proposer, "drafts_reach_the_scheduler", lambda: True)
    monkeypatch.setattr(vllm_proposer, "bind_input_batch", lambda: None)
    monkeypatch.setenv(CORPUS_GIB, "0.5")
    spec = SimpleNamespace(num_speculative_tokens=4, suffix_decoding_max_tree_depth=8,
                           suffix_decoding_max_cached_requests=10)
    config = SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=64))
    with caplog.at_level(logging.INFO, logger=vllm_proposer.logger.name):
        vllm_proposer.logger.addHandler(caplog.handler)
        try:
            proposer = vllm_proposer.GroupProposer(config)
        finally:
            vllm_proposer.logger.removeHandler(caplog.handler)
    assert proposer.corpus.max_bytes == GIB // 2 and proposer.corpus.max_finished == 10
    line = caplog.records[-1].getMessage()
    assert "corpus starts empty" in line and "without its earlier epochs' responses" in line, line
    assert "0.5 GiB" in line and "numba cache" in line, line
    monkeypatch.setenv(CORPUS_GIB, "lots")
    with pytest.raises(ValueError, match=f"{CORPUS_GIB}='lots' must be a number of GiB"):
        vllm_proposer.GroupProposer(config)


def test_the_knob_and_the_engine_share_the_default():
    knob = next(k for k in KNOBS if k.env == CORPUS_GIB)
    assert float(knob.default) == DEFAULT_CORPUS_GIB and knob.sets.lstrip("+") == RAY_ENV_KEY
