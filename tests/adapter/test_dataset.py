"""LengthAwareRLHFDataset on verl's real RLHFDataset, collate_fn and StatefulDataLoader."""
import logging

import pandas as pd
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import AutoTokenizer
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import collate_fn

from recipe.adapter.dataset import LengthAwareRLHFDataset
from recipe.adapter.fields import ROW_ID
from recipe.tiny.artifacts import build_math_parquet


@pytest.fixture(scope="module")
def tokenizer(tiny_artifacts):
    return AutoTokenizer.from_pretrained(tiny_artifacts.model_dir)


def make(cfg, files, tokenizer):
    return LengthAwareRLHFDataset(data_files=files, tokenizer=tokenizer, config=cfg.data)


def test_train_set_cut_to_whole_batches_and_logged(recipe_config, tiny_artifacts, tokenizer, tmp_path, caplog):
    odd = build_math_parquet(tmp_path / "odd.parquet", 29, seed=3, split="train")
    recipe_config.data.train_files = str(odd)
    with caplog.at_level(logging.WARNING):
        ds = make(recipe_config, str(odd), tokenizer)
    assert len(ds) == 24  # 29 -> 3 whole batches of 8
    assert "dropped 5" in caplog.text


def test_validation_set_is_not_cut(recipe_config, tiny_artifacts, tokenizer):
    val = make(recipe_config, str(tiny_artifacts.test_parquet), tokenizer)
    assert len(val) == len(pd.read_parquet(tiny_artifacts.test_parquet))


def test_too_small_train_set_is_a_clear_error(recipe_config, tokenizer, tmp_path):
    tiny = build_math_parquet(tmp_path / "tiny.parquet", 5, seed=3, split="train")
    recipe_config.data.train_files = str(tiny)
    with pytest.raises(ValueError, match="fewer than one batch"):
        make(recipe_config, str(tiny), tokenizer)


def test_row_ids_are_stable_and_reach_the_batch(recipe_config, tiny_artifacts, tokenizer):
    ds = make(recipe_config, str(tiny_artifacts.train_parquet), tokenizer)
    assert [ds[i][ROW_ID] for i in (0, 5, 17)] == [0, 5, 17]
    assert ds[5]["raw_prompt"] == ds[5]["raw_prompt"]  # deterministic item content
    loader = StatefulDataLoader(ds, batch_size=8, collate_fn=collate_fn, shuffle=True, drop_last=True)
    batch = next(iter(loader))
    proto = DataProto.from_single_dict(batch)
    rows = proto.non_tensor_batch[ROW_ID].tolist()
    # each row id names the row whose prompt it carries, after shuffling
    for rid, prompt in zip(rows, proto.non_tensor_batch["raw_prompt"]):
        assert list(ds[rid]["raw_prompt"]) == list(prompt)


def test_resume_rereads_with_the_same_cut(recipe_config, tiny_artifacts, tokenizer, tmp_path):
    odd = build_math_parquet(tmp_path / "odd2.parquet", 30, seed=4, split="train")
    recipe_config.data.train_files = str(odd)
    ds = make(recipe_config, str(odd), tokenizer)
    ds.resume_dataset_state()  # what verl calls when it restores data.pt
    assert len(ds) == 24
