"""RECORD_TOKENS (recipe/token_record.py, recipe.record_tokens): step files the acceptance estimator reads, a redone
step replaced, the size bound kept across a resume without ever deleting or cutting what was recorded, and the
settings that switch it on."""
import gzip
import json
import logging
import re

import numpy as np
import pytest
import torch

from recipe.settings import RecipeConfigError, parse_settings
from recipe.sim.acceptance import load_groups
from recipe.token_record import TokenRecorder, step_files


def step_batch(seed: int, rows=(7, 3), n=2, length=200):
    """One step's records as the trainer hands them over: responses of a row out of sample order, tensors."""
    rng = np.random.default_rng(seed)
    out = {"rows": [], "sample_index": [], "prompts": [], "responses": []}
    prompts = {r: torch.as_tensor(rng.integers(0, 1000, 5 + r)) for r in rows}
    for s in reversed(range(n)):
        for r in rows:
            out["rows"].append(r)
            out["sample_index"].append(s)
            out["prompts"].append(prompts[r])
            out["responses"].append(torch.as_tensor(rng.integers(0, 1000, length + 10 * s + r)))
    return out


def snapshot(directory):
    return {p.name: p.read_bytes() for p in step_files(directory)}


def test_step_files_are_the_estimators_groups(tmp_path):
    rec = TokenRecorder(tmp_path / "tokens", max_bytes=10**7)
    b1, b2 = step_batch(1), step_batch(2)
    rec.record(1, 0, **b1)
    rec.record(2, 1, **b2)
    assert [p.name for p in step_files(tmp_path / "tokens")] == ["step_000001.jsonl.gz", "step_000002.jsonl.gz"]
    lines = gzip.decompress((tmp_path / "tokens" / "step_000002.jsonl.gz").read_bytes()).decode().splitlines()
    first = json.loads(lines[0])
    assert set(first) == {"prompt_id", "epoch", "step", "prompt", "responses"}
    assert (first["prompt_id"], first["epoch"], first["step"]) == ("7", 1, 2)
    groups = load_groups(tmp_path / "tokens")
    assert [(g.prompt_id, g.epoch) for g in groups] == [("7", 0), ("3", 0), ("7", 1), ("3", 1)]
    for g, b in ((groups[0], b1), (groups[3], b2)):  # responses in sample order, prompt and ids as handed over
        mine = [i for i, r in enumerate(b["rows"]) if str(r) == g.prompt_id]
        by_sample = sorted(mine, key=lambda i: b["sample_index"][i])
        assert [r.tolist() for r in g.responses] == [b["responses"][i].tolist() for i in by_sample]
        assert g.prompt.tolist() == b["prompts"][mine[0]].tolist()
    assert [g.prompt_id for g in load_groups(tmp_path / "tokens" / "step_000001.jsonl.gz")] == ["7", "3"]
    assert rec.last_metrics == {"record_tokens/bytes": float(sum(len(v) for v in snapshot(tmp_path / "tokens")
                                                                 .values())), "record_tokens/stopped": 0.0}


def test_a_redone_step_replaces_its_file(tmp_path):
    rec = TokenRecorder(tmp_path, max_bytes=10**7)
    rec.record(4, 0, **step_batch(1))
    rec.record(4, 0, **step_batch(2, rows=(9,)))
    assert [g.prompt_id for g in load_groups(tmp_path)] == ["9"]
    assert rec.total_bytes == (tmp_path / "step_000004.jsonl.gz").stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["step_000004.jsonl.gz"]  # no temporary file left


def test_the_bound_stops_recording_without_touching_what_is_there(tmp_path, caplog):
    one = TokenRecorder(tmp_path / "probe", max_bytes=10**7)
    size = one.record(1, 0, **step_batch(1))["record_tokens/bytes"]
    rec = TokenRecorder(tmp_path / "tokens", max_bytes=int(2.5 * size))
    rec.record(1, 0, **step_batch(1))
    rec.record(2, 0, **step_batch(2))
    kept = snapshot(tmp_path / "tokens")
    with caplog.at_level(logging.WARNING, logger="recipe.token_record"):
        m = rec.record(3, 0, **step_batch(3))
        rec.record(4, 0, **step_batch(4, rows=(1,), length=5))  # would fit, but the recording has stopped
    assert m == {"record_tokens/bytes": float(sum(map(len, kept.values()))), "record_tokens/stopped": 1.0}
    assert snapshot(tmp_path / "tokens") == kept and rec.total_bytes <= rec.max_bytes
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "RECORD_TOKENS_MAX_MB" in warned[0], warned
    assert rec.last_metrics["record_tokens/stopped"] == 1.0


def test_a_resumed_run_counts_what_is_there(tmp_path):
    first = TokenRecorder(tmp_path, max_bytes=10**7)
    first.record(1, 0, **step_batch(1))
    first.record(2, 0, **step_batch(2))
    kept = snapshot(tmp_path)
    on_disk = sum(map(len, kept.values()))
    resumed = TokenRecorder(tmp_path, max_bytes=on_disk + 100)
    assert resumed.last_metrics == {"record_tokens/bytes": float(on_disk), "record_tokens/stopped": 0.0}
    resumed.record(3, 0, **step_batch(3))  # a fresh count (0) would let it in
    assert resumed.stopped and snapshot(tmp_path) == kept
    # redoing a recorded step swaps its bytes: the step it replaces no longer counts
    redo = TokenRecorder(tmp_path, max_bytes=on_disk + 100)
    redo.record(2, 0, **step_batch(2))
    assert not redo.stopped and redo.total_bytes == on_disk


def test_mismatched_columns_are_refused(tmp_path):
    b = step_batch(1)
    b["sample_index"] = b["sample_index"][:-1]
    with pytest.raises(ValueError, match="4 rows, 3 sample indexes"):
        TokenRecorder(tmp_path, 10**7).record(1, 0, **b)


def settings(**record_tokens):
    cfg = {"data": {"train_batch_size": 1, "max_response_length": 64, "sampler": {"class_path": None}}}
    if record_tokens:
        cfg["recipe"] = {"record_tokens": record_tokens}
    return parse_settings(cfg).record_tokens


def test_settings_default_off_at_1024_mb():
    s = settings()
    assert (s.enabled, s.max_mb, s.path, s.max_bytes) == (False, 1024, None, 1024 * 2**20)
    s = settings(enable="1", max_mb="3", path="/tmp/t")
    assert (s.enabled, s.max_mb, s.path, s.max_bytes) == (True, 3, "/tmp/t", 3 * 2**20)
    assert settings(enable=True, path="null").path is None


@pytest.mark.parametrize("key,value,message", [
    ("enable", "yes", "recipe.record_tokens.enable (env RECORD_TOKENS) must be 0/1 or true/false"),
    ("max_mb", 0, "recipe.record_tokens.max_mb (env RECORD_TOKENS_MAX_MB) must be >= 1"),
    ("max_mb", "1.5", "recipe.record_tokens.max_mb (env RECORD_TOKENS_MAX_MB) must be an integer"),
])
def test_bad_settings_name_the_key_and_variable(key, value, message):
    with pytest.raises(RecipeConfigError, match=re.escape(message)):
        settings(**{key: value})
