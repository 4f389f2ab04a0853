"""LengthAwareTrainer hooks driven with real verl objects on CPU.

What runs for real: verl's PPOTrainer/PPOTrainerSync constructors, ``_init_tokenizer``, ``_init_dataloader`` (then
our override), ``_next_train_batch`` (verl's fetch from the StatefulDataLoader + our fields), TransferQueue (a real
local Ray cluster with one storage unit) holding trajectory records written the way verl's AgentLoopWorkerTQ writes
them, and our ``observe_batch`` reading them back. What cannot run here: ``super().step()`` itself (Megatron
workers and vLLM servers need GPUs), so the tests call ``observe_batch`` with the batch meta that step would return.
"""
import json

import numpy as np
import torch
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.adapter.fields import CAP, PREDICTION, ROW_ID
from recipe.adapter.sampler import LengthAwareEpochSampler

from recipe.testing.recipe_config import ROLLOUT_N as N_RESP
from recipe.testing.recipe_config import TRAIN_BATCH, compose_recipe



def make_trainer(tiny_artifacts, tmp_path, *overrides):
    from recipe.adapter.trainer import LengthAwareTrainer

    cfg = compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={tmp_path}/run", *overrides])
    trainer = LengthAwareTrainer(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer.global_steps = 1
    return trainer


def put_trajectories(tq, batch, lengths_of):
    """Write one record per response as AgentLoopWorkerTQ._agent_loop_postprocess does: the agent-loop output
    fields plus the prompt's row fields (kwargs), keys ``{uid}_{session}_0``."""
    from transfer_queue import KVBatchMeta

    keys, fields, tags = [], [], []
    for i in range(len(batch)):
        row = {k: batch[k][i] for k in (ROW_ID, CAP, PREDICTION)}
        row[ROW_ID] = int(batch[ROW_ID][i])
        for s in range(N_RESP):
            n = int(lengths_of(row[ROW_ID], s))
            keys.append(f"{batch['uid'][i]}_{s}_0")
            fields.append({"response_mask": torch.ones(n, dtype=torch.int64), **row})
            tags.append({"status": "success", "response_len": n})
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    return KVBatchMeta(partition_id="train", keys=keys, tags=tags)


def true_len(row, s):
    return 5 + (row * 7) % 50 + s


def test_dataloader_uses_the_length_aware_sampler(tiny_artifacts, tmp_path):
    trainer = make_trainer(tiny_artifacts, tmp_path)
    assert isinstance(trainer.train_dataloader.sampler, LengthAwareEpochSampler)
    assert trainer.length_sampler is trainer.train_dataloader.sampler


def test_baseline_keeps_verls_sampler(tiny_artifacts, tmp_path):
    trainer = make_trainer(tiny_artifacts, tmp_path, "data.sampler.class_path=null", "recipe.cap.enable=0")
    assert trainer.length_sampler is None
    assert not isinstance(trainer.train_dataloader.sampler, LengthAwareEpochSampler)
    batch = trainer._next_train_batch()
    assert batch[CAP].tolist() == [0] * TRAIN_BATCH and torch.isnan(batch[PREDICTION]).all()


def test_first_batch_has_no_estimates_and_no_cap(tiny_artifacts, tmp_path):
    trainer = make_trainer(tiny_artifacts, tmp_path)
    batch = trainer._next_train_batch()
    assert batch[CAP].tolist() == [0] * TRAIN_BATCH
    assert torch.isnan(batch[PREDICTION]).all()
    assert len(set(int(r) for r in batch[ROW_ID])) == TRAIN_BATCH


def test_step_observation_updates_estimates_then_caps_next_epoch(tiny_artifacts, tmp_path, tq_cluster):
    """A whole epoch of steps through TransferQueue: estimates fill, metrics and traces appear, and batches of the
    next epoch carry predictions and the seed cap (factor 1.0 here so that it binds: min_tokens=16, response 64)."""
    trainer = make_trainer(tiny_artifacts, tmp_path, "recipe.cap.factor=1.0")
    steps = trainer.steps_per_epoch
    for step in range(1, steps + 1):
        trainer.global_steps = step
        batch = trainer._next_train_batch()
        meta = put_trajectories(tq_cluster, batch, true_len)
        metrics = trainer.observe_batch(meta, gen_time_s=1.5)
        tq_cluster.kv_clear(keys=meta.keys, partition_id="train")
    assert trainer.length_sampler.estimates.seen_ratio() == 1.0
    rows = np.arange(trainer.length_sampler.num_rows)
    expected = np.array([true_len(r, 0) + 0.5 for r in rows])  # mean of the two responses
    assert np.allclose(trainer.length_sampler.estimates.value, expected)
    assert metrics["sampler/seen_ratio"] == 1.0 and metrics["rollout/response_max_tokens_cap"] == 0.0

    trainer.global_steps = steps + 1
    batch = trainer._next_train_batch()
    pred = batch[PREDICTION].numpy()
    got_rows = np.array([int(r) for r in batch[ROW_ID]])
    assert np.allclose(pred, expected[got_rows])
    want_cap = max(16, int(np.ceil(1.0 * pred.mean())))
    assert want_cap < 64, "the test must exercise a binding cap"
    assert batch[CAP].tolist() == [want_cap] * TRAIN_BATCH
    # one sorted epoch: the batch's predictions are close together (bucketed), far tighter than the data's spread
    assert np.ptp(pred) < np.ptp(expected)

    before = trainer.length_sampler.estimates.value.copy()
    meta = put_trajectories(tq_cluster, batch, lambda r, s: want_cap)  # every response stopped by the cap
    metrics = trainer.observe_batch(meta, gen_time_s=2.0)
    assert metrics["rollout/cap_hit_ratio"] == 1.0
    assert metrics["rollout/response_max_tokens_cap"] == want_cap
    after = trainer.length_sampler.estimates.value
    # censored at the cap: a lower bound never lowers an estimate, and raises the ones below it
    above = got_rows[before[got_rows] > want_cap]
    below = got_rows[before[got_rows] < want_cap]
    assert len(above) and np.array_equal(after[above], before[above])
    assert len(below) and np.all(after[below] > before[below])
    records = [json.loads(line) for line in open(tmp_path / "run" / "length_traces.jsonl")]
    assert [r["step"] for r in records] == list(range(1, steps + 2))
    assert records[-1]["epoch"] == 1 and len(records[-1]["lengths"]) == TRAIN_BATCH * N_RESP
    assert records[-1]["finish"] == ["cap"] * (TRAIN_BATCH * N_RESP) and records[-1]["cap"] == want_cap
    assert records[-1]["sample_index"] == [s for _ in range(TRAIN_BATCH) for s in range(N_RESP)]


def test_sampling_seeds_are_per_epoch_and_row(tiny_artifacts, tmp_path):
    """recipe.sampling_seed: each row carries a seed that depends on (seed, epoch, row) only."""
    from recipe.adapter.fields import SEED
    from recipe.core.seeds import row_seeds

    trainer = make_trainer(tiny_artifacts, tmp_path, "recipe.sampling_seed=7")
    batch = trainer._next_train_batch()
    rows = [int(r) for r in batch[ROW_ID]]
    assert batch[SEED].tolist() == row_seeds(7, trainer.length_sampler.plan.epoch, rows).tolist()
    assert len(set(batch[SEED].tolist())) == len(rows)
    assert make_trainer(tiny_artifacts, tmp_path / "b")._next_train_batch().get(SEED, None) is None
