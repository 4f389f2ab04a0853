"""The tail cut on a real vLLM CPU engine, through verl's own agent-loop worker and replay buffer.

Real: the recipe trainer's hooks (``on_sample_begin`` starts the watch, ``on_sample_end`` stops it, ``observe_batch``),
verl's ``AgentLoopWorkerTQ`` running the recipe's agent loop, verl's ``ReplayBuffer.sample``, TransferQueue, and a
vLLM engine whose requests are aborted mid-generation. Stand-ins, as in test_oversample_engine.py:
``ForcedLengths`` for verl's server client and Ray-managed vLLM server, ``EngineReplicas`` for the
CheckpointEngineManager (abort -> the engine's abort), ``OneWorker`` for the agent-loop manager.

One batch of 8 rows x 4 responses: 7 rows stop after 24 tokens, one runs to 1500. With a tail cut at 0.875 the step
ends once 28 responses are done: the long row's 4 are aborted where they are and trained as truncated.
"""
import json

import numpy as np
import pytest
import torch

from recipe.adapter.columns import column_to_numpy
from recipe.adapter.fields import CAP, ROW_ID
from recipe.route_record.config import compose_recipe
from harness.engine_doubles import EngineReplicas, attach_engine

pytestmark = pytest.mark.engine

B, N, SHORT, LONG = 8, 4, 24, 1500


def test_the_tail_cut_ends_a_step_and_trains_the_stragglers_truncated(vllm_engine, tiny_artifacts, tmp_path,
                                                                     tq_cluster):

    from recipe.adapter.trainer import LengthAwareTrainer

    cfg = compose_recipe(tiny_artifacts, [
        f"trainer.default_local_dir={tmp_path}/run", "data.max_response_length=1900", f"data.train_batch_size={B}",
        f"data.gen_batch_size={B}", f"actor_rollout_ref.actor.ppo_mini_batch_size={B}",
        f"actor_rollout_ref.rollout.n={N}", "recipe.cap.enable=0", "recipe.tail_cut.enable=1",
        "recipe.tail_cut.fraction=0.875"])
    long_row = {}

    class Trainer(LengthAwareTrainer):
        def _next_train_batch(self, num_prompts=None):  # forced lengths through the real cap field
            batch = super()._next_train_batch(num_prompts)
            rows = column_to_numpy(batch[ROW_ID], dtype=np.int64)
            long_row["row"] = int(rows[0])
            batch[CAP][:] = torch.as_tensor([LONG if i == 0 else SHORT for i in range(len(rows))])
            return batch

    trainer = Trainer(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    attach_engine(trainer, cfg, vllm_engine)
    trainer.checkpoint_manager = EngineReplicas(vllm_engine)
    trainer.curr_step_profile, trainer.timing_raw, trainer.global_steps = False, {}, 1
    trainer.replay_buffer.poll_interval = 0.02
    trainer.tail_cut.poll_s = 0.02

    trainer.prepare_step()
    trainer.on_sample_begin()
    try:
        batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=B)
        trainer.on_sample_end()
        trainer.observe_batch(batch, gen_time_s=0.0)
        tq_cluster.kv_clear(keys=batch.keys, partition_id="train")
        trainer.on_step_end()

        calls = trainer.checkpoint_manager.calls
        assert calls[:2] == ["abort", "sleep"] and calls[-1] == "resume"
        assert trainer.tail_cut.last_metrics == {"rollout/tail_cut/cut": 1.0, "rollout/tail_cut/cut_responses": 4.0,
                                                 "rollout/tail_cut/abort_failed": 0.0}
        assert vllm_engine.run(vllm_engine.wait_until_idle()) == {"frontend": 0, "running": 0, "waiting": 0}
        record = json.loads((tmp_path / "run" / "length_traces.jsonl").read_text().splitlines()[-1])
        assert len(set(record["rows"])) == B and len(record["rows"]) == B * N  # every group trained, none dropped
        for row, length, finish in zip(record["rows"], record["lengths"], record["finish"]):
            if row == long_row["row"]:
                assert finish == "cut" and 0 < length < LONG  # stopped where it was, trained truncated
            else:
                assert finish == "eos" and length == SHORT
    finally:  # a failure above must not leave the watch thread polling (and aborting) under later tests
        trainer.tail_cut.stop(launched_responses=0)
