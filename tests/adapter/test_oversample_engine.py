"""Over-sample then abort, end to end on the real vLLM CPU engine, in both re-queue modes.

Real: the recipe trainer's hooks (prepare_step, on_sample_end, on_step_end, observe_batch), verl's ReplayBuffer.sample
and AgentLoopWorkerTQ (its plain class, running our agent loop registered from configs/agent_loops.yaml), TransferQueue,
and a vLLM engine generating and aborting. Stand-ins, because verl's versions need GPUs and Ray-managed servers:
``ForcedLengths`` for the vLLM HTTP server (forced lengths: ignore_eos), ``EngineReplicas`` for the
CheckpointEngineManager (abort -> engine abort; sleep/wake/update are no-ops), and ``OneWorker`` which hands
each batch to the one in-process worker instead of spreading it over Ray actors (recipe/route_record/engine.py).

The same protocol runs through verl's real vLLM server in tests/e2e/test_over_sample.py; this test stays because
forced lengths make every race deterministic (which groups win, where each aborted one stops), so it can check at
the token level what the real run can only check on text: each resumed response starts with exactly its own
session's step-1 tokens and reaches its full length, and the engine is idle after every abort.
"""
import time

import numpy as np
import pytest
import torch

from recipe.adapter.columns import column_to_numpy
from recipe.adapter.fields import CAP, ROW_ID
from recipe.route_record.config import compose_recipe
from harness.engine_doubles import EngineReplicas, attach_engine

pytestmark = pytest.mark.engine

# batch, rollout.n, forced lengths (response_length 1900). verl's replay buffer polls TransferQueue and, when more
# than B groups are finished at a poll, picks among them arbitrarily (ties on global step): every race here is won
# by hundreds of tokens, and the groups that must finish last are staggered so no two end together.
# Step 1: four SHORT rows beat two TARGET rows; step 2 (continue): the two resumed TARGET rows need far fewer tokens
# than the new rows, forced to STAGGERED lengths.
B, N, SHORT, TARGET = 4, 2, 8, 300
STAGGERED = (900, 1400, 1850, 1850)


@pytest.fixture(params=["restart", "continue"])
def rig(request, vllm_engine, tiny_artifacts, tmp_path, tq_cluster):

    from recipe.adapter.trainer import LengthAwareTrainer

    cfg = compose_recipe(tiny_artifacts, [
        f"trainer.default_local_dir={tmp_path}/run", "data.max_response_length=1900", f"data.train_batch_size={B}",
        f"data.gen_batch_size={B}", f"actor_rollout_ref.actor.ppo_mini_batch_size={B}",
        f"actor_rollout_ref.rollout.n={N}", "recipe.cap.enable=0", "recipe.over_sample.enable=1",
        "recipe.over_sample.ratio=0.5", f"recipe.over_sample.requeue={request.param}"])
    forced: dict[int, int] = {}

    class Trainer(LengthAwareTrainer):
        def _next_train_batch(self, num_prompts=None):  # forced per-row lengths through the real cap field
            batch = super()._next_train_batch(num_prompts)
            rows = column_to_numpy(batch[ROW_ID], dtype=np.int64)
            batch[CAP][:] = torch.as_tensor([forced.get(int(r), SHORT) for r in rows])
            return batch

    trainer = Trainer(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    server = attach_engine(trainer, cfg, vllm_engine)
    trainer.checkpoint_manager = EngineReplicas(vllm_engine)
    trainer.curr_step_profile, trainer.timing_raw = False, {}
    trainer.replay_buffer.poll_interval = 0.05
    yield request.param, trainer, server, forced, tq_cluster
    left = list((tq_cluster.kv_list("train") or {}).get("train", {}))
    if left:
        tq_cluster.kv_clear(keys=left, partition_id="train")


def run_step(trainer, server, tq, step):
    trainer.global_steps, server.global_steps = step, step - 1
    trainer.prepare_step()
    batch, _ = trainer.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=B)
    trainer.on_sample_end()
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                           select_fields=[ROW_ID, "responses", "response_mask", "extra_fields"])
    trainer.observe_batch(batch, gen_time_s=0.0)
    tq.kv_clear(keys=batch.keys, partition_id="train")
    trainer.on_step_end()
    return data, [int(k.rsplit("_", 2)[1]) for k in batch.keys]


def test_abort_keeps_complete_groups_and_requeues_the_rest(rig, vllm_engine):
    mode, trainer, server, forced, tq = rig
    plan = trainer.length_sampler.plan
    # step 1: the plan's next 6 rows; the last two are forced long and lose the race
    plan.start_next_epoch()
    upcoming = plan.remaining()[:6].tolist()
    forced.update({upcoming[4]: TARGET, upcoming[5]: TARGET})
    data, _ = run_step(trainer, server, tq, 1)
    m1 = trainer.over_sample.last_metrics
    rows1 = column_to_numpy(data[ROW_ID], dtype=np.int64)
    assert sorted(set(rows1.tolist())) == sorted(upcoming[:4]) and len(rows1) == B * N  # whole groups
    assert [int(m.sum()) for m in data["response_mask"].unbind()] == [SHORT] * (B * N)
    assert m1["rollout/over_sample/launched_groups"] == 6 and m1["rollout/over_sample/aborted_groups"] == 2
    assert vllm_engine.run(vllm_engine.wait_until_idle()) == {"frontend": 0, "running": 0, "waiting": 0}
    assert trainer.checkpoint_manager.calls[:2] == ["abort", "sleep"] and "resume" in trainer.checkpoint_manager.calls
    aborted = {upcoming[4], upcoming[5]}
    assert set(plan.remaining().tolist()) >= aborted
    items = (tq.kv_list("train") or {}).get("train", {})
    assert not [k for k, t in items.items() if t.get("is_prompt")]  # no prompt of step 1 left behind

    partial_tokens = {}
    if mode == "continue":
        assert plan.remaining()[:2].tolist() == [upcoming[4], upcoming[5]]  # resumed first
        assert set(trainer.over_sample.partials) == aborted
        for row, ref in trainer.over_sample.partials.items():
            got = tq.kv_batch_get(keys=[ref.key(s) for s in range(N)], partition_id="train",
                                  select_fields=["responses"])["responses"]
            partial_tokens[row] = [t.tolist() for t in got.unbind()]
            assert all(0 < len(t) < TARGET for t in partial_tokens[row]) and not any(ref.complete)
        assert m1["rollout/over_sample/kept_partial_tokens"] == m1["rollout/over_sample/aborted_tokens"] > 0
    else:
        assert sorted(plan.remaining()[-2:].tolist()) == sorted(aborted) and not trainer.over_sample.partials
        assert m1["rollout/over_sample/discarded_tokens"] == m1["rollout/over_sample/aborted_tokens"] > 0
        assert not [k for k in items]  # restart: the aborted trajectories are gone too

    # step 2: the generation after an abort works; in continue mode the resumed groups finish their responses
    nxt = plan.remaining()[:6].tolist()
    fresh = [r for r in nxt if r not in forced]
    for r, length in zip(fresh, STAGGERED if mode == "continue" else [SHORT] * len(fresh)):
        forced[r] = length
    data, sessions = run_step(trainer, server, tq, 2)
    rows2 = column_to_numpy(data[ROW_ID], dtype=np.int64)
    assert len(set(rows2.tolist())) == B and len(rows2) == B * N
    if mode == "continue":
        assert aborted <= set(rows2.tolist())
        seqs = [t.tolist() for t in data["responses"].unbind()]
        for r, session, seq, extra in zip(rows2.tolist(), sessions, seqs, list(data["extra_fields"])):
            if r in aborted:
                assert len(seq) == TARGET  # the full response: partial + continuation
                own = partial_tokens[r][session]
                assert seq[:len(own)] == own  # starts with its own session's step-1 tokens
                assert extra["min_global_steps"] == 0 and extra["max_global_steps"] == 1  # spans two versions
        assert trainer.over_sample.last_metrics["rollout/over_sample/resumed_groups"] == 2
    time.sleep(0.1)
    assert vllm_engine.run(vllm_engine.wait_until_idle()) == {"frontend": 0, "running": 0, "waiting": 0}
