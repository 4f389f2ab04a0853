"""RECORD_TOKENS in the trainer: ``observe_batch`` reads each trained record's ``prompts`` and ``responses`` from a
real TransferQueue (written the way verl's AgentLoopWorkerTQ writes them: unpadded, one tensor per record) and
records them per step, with the row id, sample order and epoch; off by default."""
import numpy as np
import torch
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.adapter.fields import CAP, PREDICTION, ROW_ID
from recipe.sim.acceptance import load_groups
from recipe.route_record.config import ROLLOUT_N, TRAIN_BATCH
from harness.trainers import make_trainer


def prompt_of(row):
    return list(range(100 + row, 103 + 2 * row))  # prompts of different lengths: stored unpadded


def response_of(row, s):
    return [1000 * s + row] * (3 + row % 5 + s)


def put_step(tq, batch):
    """The step's records, sessions written in reverse so the recorder has to restore the sample order."""
    from transfer_queue import KVBatchMeta

    keys, fields, tags = [], [], []
    for i in range(len(batch)):
        row = int(batch[ROW_ID][i])
        for s in reversed(range(ROLLOUT_N)):
            response = response_of(row, s)
            keys.append(f"{batch['uid'][i]}_{s}_0")
            fields.append({ROW_ID: row, CAP: batch[CAP][i], PREDICTION: batch[PREDICTION][i],
                           "prompts": torch.tensor(prompt_of(row)), "responses": torch.tensor(response),
                           "response_mask": torch.ones(len(response), dtype=torch.int64)})
            tags.append({"status": "success", "response_len": len(response)})
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    return KVBatchMeta(partition_id="train", keys=keys, tags=tags)


def test_each_steps_prompts_and_responses_are_recorded(tiny_artifacts, tmp_path, tq_cluster):
    trainer = make_trainer(tiny_artifacts, tmp_path, "recipe.record_tokens.enable=1")
    batch = trainer._next_train_batch()
    metrics = trainer.observe_batch(put_step(tq_cluster, batch), gen_time_s=1.0)
    files = sorted((tmp_path / "run" / "tokens").iterdir())
    assert [f.name for f in files] == ["step_000001.jsonl.gz"]
    assert metrics["record_tokens/bytes"] == files[0].stat().st_size and metrics["record_tokens/stopped"] == 0.0
    groups = load_groups(tmp_path / "run" / "tokens")
    rows = sorted(int(r) for r in batch[ROW_ID])
    assert sorted(int(g.prompt_id) for g in groups) == rows and len(groups) == TRAIN_BATCH
    for g in groups:
        row = int(g.prompt_id)
        assert g.epoch == 0 and g.prompt.tolist() == prompt_of(row)
        assert [r.tolist() for r in g.responses] == [response_of(row, s) for s in range(ROLLOUT_N)]


def test_off_by_default(tiny_artifacts, tmp_path, tq_cluster):
    trainer = make_trainer(tiny_artifacts, tmp_path)
    assert trainer.token_recorder is None
    metrics = trainer.observe_batch(put_step(tq_cluster, trainer._next_train_batch()), gen_time_s=1.0)
    assert not any(k.startswith("record_tokens/") for k in metrics)
    assert not (tmp_path / "run" / "tokens").exists()
    assert np.isfinite(metrics["sampler/epoch"])


def test_verl_stores_each_records_prompt_unpadded():
    """What the recorder relies on (verl 0.9.1): a record's ``prompts`` is its own prompt ids, not a padded batch
    row, and its ``responses`` its own response ids (tool outputs included in multi-turn)."""
    import inspect

    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.trainer.ppo.v1 import agent_loop_tq

    source = inspect.getsource(AgentLoopOutput.as_dict)
    assert 'output["prompts"] = torch.tensor(output.pop("prompt_ids")' in source
    assert 'output["responses"] = torch.tensor(output.pop("response_ids")' in source
    assert "field = output.as_dict()" in inspect.getsource(agent_loop_tq)  # what AgentLoopWorkerTQ puts
