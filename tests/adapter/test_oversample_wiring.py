"""Over-sampling wired into verl's v1 sync step: our prepare_step / on_sample_end / on_step_end around verl's real
ReplayBuffer.sample on a real TransferQueue.

Test doubles, because the real parts need GPUs: ``FakeRollout`` plays verl's AgentLoopManagerTQ (it writes each
group's trajectories and prompt status into TransferQueue the way AgentLoopWorkerTQ does, finishing the short
groups at once and leaving the long ones running) and ``FakeReplicas`` plays the CheckpointEngineManager (its
abort_replicas finishes the running groups with partial responses, as aborted vLLM requests do). The abort itself
on a real vLLM engine is covered in test_oversample_engine.py.
"""
import math

import numpy as np
import pytest
import torch
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.adapter.columns import column_to_numpy
from recipe.adapter.fields import CAP, PREDICTION, ROLLOUT_STEP, ROW_ID
from recipe.adapter.partial import RESUME_AT
from recipe.route_record.config import ROLLOUT_N, TRAIN_BATCH, compose_recipe
from recipe.traces import read_records

RATIO = 0.5


def length_of(row):
    return 5 + (row * 13) % 55  # response length each row "wants" (< 64)


class FakeRollout:
    """Stands in for AgentLoopManagerTQ: of each launch, the TRAIN_BATCH groups wanting the fewest tokens finish at
    once (the race the fastest groups win), the others keep running until aborted."""

    def __init__(self, tq):
        self.tq, self.running = tq, {}

    def put_group(self, uid, row, n_tokens, fields):
        keys = [f"{uid}_{s}_0" for s in range(ROLLOUT_N)]
        recs = [{"prompts": torch.arange(3, dtype=torch.int64), "responses": torch.full((n_tokens,), 7),
                 "response_mask": torch.ones(n_tokens, dtype=torch.int64), ROW_ID: row, **fields} for _ in keys]
        tags = [{"status": "success", "response_len": n_tokens, "global_steps": 1,
                 "min_global_steps": 1, "max_global_steps": 1} for _ in keys]
        self.tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(recs), tags=tags)
        self.tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})

    def generate_sequences(self, batch):
        rows = [int(r) for r in batch[ROW_ID]]
        winners = set(np.argsort([length_of(r) for r in rows], kind="stable")[:TRAIN_BATCH].tolist())
        for i in range(len(batch)):
            uid, row = str(batch["uid"][i]), rows[i]
            fields = {CAP: batch[CAP][i], PREDICTION: batch[PREDICTION][i]}
            if i in winners:
                self.put_group(uid, row, length_of(row), fields)
            else:
                self.tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
                self.running[uid] = (row, fields)


class FakeReplicas:
    """Stands in for CheckpointEngineManager: abort finishes running groups with 3-token partial responses."""

    def __init__(self, rollout):
        self.rollout, self.calls = rollout, []

    def abort_replicas(self, reject_request=False):
        self.calls.append(("abort", reject_request))
        for uid, (row, fields) in self.rollout.running.items():
            self.rollout.put_group(uid, row, 3, fields)
        self.rollout.running.clear()

    def sleep_replicas(self):
        self.calls.append(("sleep",))

    def update_weights(self, step=None):
        self.calls.append(("update_weights",))

    def resume_generation_replicas(self):
        self.calls.append(("resume",))


def test_over_sampled_epochs_train_every_prompt_once(tiny_artifacts, tmp_path, tq_cluster):
    from recipe.adapter.trainer import LengthAwareTrainer

    cfg = compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={tmp_path}/run", "recipe.over_sample.enable=1", "recipe.cap.enable=0",
                                          f"recipe.over_sample.ratio={RATIO}", "recipe.over_sample.abort_events=1"])
    trainer = LengthAwareTrainer(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    assert trainer.train_dataloader.batch_size == 1 and trainer.config.data.gen_batch_size == 1
    rollout = FakeRollout(tq_cluster)
    trainer.agent_loop_manager = rollout
    trainer.checkpoint_manager = FakeReplicas(rollout)
    trainer.curr_step_profile = False
    trainer.replay_buffer.poll_interval = 0.01

    n_rows = trainer.length_sampler.num_rows
    launch = math.ceil(TRAIN_BATCH * (1 + RATIO))
    trained_by_epoch, all_metrics = {}, []
    for step in range(1, 2 * trainer.steps_per_epoch + 1):
        trainer.global_steps, trainer.timing_raw = step, {}
        trainer.prepare_step()
        batch, _ = trainer.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=TRAIN_BATCH)
        trainer.on_sample_end()
        data = tq_cluster.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=[ROW_ID])
        rows = sorted(set(column_to_numpy(data[ROW_ID], dtype=np.int64).tolist()))
        assert len(rows) == TRAIN_BATCH and len(batch.keys) == TRAIN_BATCH * ROLLOUT_N  # whole groups only
        epoch = trainer.length_sampler.plan.epoch
        trained_by_epoch.setdefault(epoch, []).extend(rows)
        metrics = {**trainer.observe_batch(batch, gen_time_s=1.0), **trainer.over_sample.last_metrics}
        all_metrics.append(metrics)
        tq_cluster.kv_clear(keys=batch.keys, partition_id="train")
        trainer.on_step_end()
        # nothing of this step is left in TransferQueue: aborted groups were cleared
        assert not (tq_cluster.kv_list("train") or {}).get("train")

    for epoch, rows in trained_by_epoch.items():
        assert sorted(rows) == list(range(n_rows)), f"epoch {epoch}"
    first = all_metrics[0]
    assert first["rollout/over_sample/launched_groups"] == launch
    assert first["rollout/over_sample/completed_groups"] == TRAIN_BATCH
    assert first["rollout/over_sample/aborted_groups"] == launch - TRAIN_BATCH
    assert first["rollout/over_sample/aborted_tokens"] == 3 * ROLLOUT_N * (launch - TRAIN_BATCH)
    last = all_metrics[trainer.steps_per_epoch - 1]
    assert last["rollout/over_sample/launched_groups"] == TRAIN_BATCH  # epoch end: nothing left to over-sample
    assert ("abort", True) in trainer.checkpoint_manager.calls and ("resume",) in trainer.checkpoint_manager.calls
    calls = [c[0] for c in trainer.checkpoint_manager.calls]
    assert calls.index("abort") < calls.index("sleep") < calls.index("update_weights") < calls.index("resume")
    # aborted partial lengths (3 tokens) never pulled an estimate below what the row really produced
    est = trainer.length_sampler.estimates
    trained = np.array(sorted(set(trained_by_epoch[0])))
    assert np.all(est.value[trained] >= 3)
    # every row was trained once per epoch, so its full length was observed at least once: with censoring the
    # 3-token partials of its aborted attempts did not drag it down
    assert np.all(est.value >= [length_of(r) for r in range(n_rows)])
    events = (tmp_path / "run" / "over_sample_events.jsonl").read_text().splitlines()
    assert len(events) == sum(m["rollout/over_sample/aborted_groups"] for m in all_metrics)


def over_sampled_trainer(tiny_artifacts, run_dir, tq, *overrides):
    from recipe.adapter.trainer import LengthAwareTrainer

    cfg = compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={run_dir}", "recipe.over_sample.enable=1",
                                          "recipe.cap.enable=0", f"recipe.over_sample.ratio={RATIO}", *overrides])
    trainer = LengthAwareTrainer(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    rollout = FakeRollout(tq)
    trainer.agent_loop_manager = rollout
    trainer.checkpoint_manager = FakeReplicas(rollout)
    trainer.curr_step_profile = False
    trainer.replay_buffer.poll_interval = 0.01
    return trainer


def run_step(trainer, tq, step):
    trainer.global_steps, trainer.timing_raw = step, {}
    trainer.prepare_step()
    batch, _ = trainer.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=TRAIN_BATCH)
    trainer.on_sample_end()
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=[ROW_ID])
    rows = sorted(set(column_to_numpy(data[ROW_ID], dtype=np.int64).tolist()))
    epoch = trainer.length_sampler.plan.epoch
    trainer.observe_batch(batch, gen_time_s=1.0)
    tq.kv_clear(keys=batch.keys, partition_id="train")
    trainer.on_step_end()
    return epoch, rows


def test_resume_before_an_epochs_last_step_trains_every_prompt_once(tiny_artifacts, tmp_path, tq_cluster):
    """A checkpoint taken just before an epoch's last step, restored the way verl restores it (the dataloader's
    state_dict through data.pt; torchdata applies it to the sampler only when the dataloader is next iterated): the
    first over-sampled launch after the resume must see the restored epoch (the epoch's last B rows), not a fresh
    one, so the epoch still trains every prompt exactly once and the next epoch starts clean."""
    import torch

    first = over_sampled_trainer(tiny_artifacts, tmp_path / "a", tq_cluster)
    per_epoch = first.steps_per_epoch
    trained = {}
    for step in range(1, per_epoch):
        epoch, rows = run_step(first, tq_cluster, step)
        trained.setdefault(epoch, []).extend(rows)
    path = tmp_path / "data.pt"
    torch.save(first.train_dataloader.state_dict(), path)

    resumed = over_sampled_trainer(tiny_artifacts, tmp_path / "b", tq_cluster)
    resumed.train_dataloader.load_state_dict(torch.load(path, weights_only=False))
    for step in range(per_epoch, 2 * per_epoch + 1):
        epoch, rows = run_step(resumed, tq_cluster, step)
        trained.setdefault(epoch, []).extend(rows)
    n_rows = resumed.length_sampler.num_rows
    assert sorted(trained[0]) == list(range(n_rows))
    assert sorted(trained[1]) == list(range(n_rows))


def test_a_response_that_stopped_before_the_abort_is_an_exact_length(tiny_artifacts, tmp_path, tq_cluster):
    """An aborted group may hold responses that had already emitted EOS: those lengths are exact (``eos`` in the
    trace, uncensored in the estimates); the rest were cut by the abort (``abort``, lower bounds)."""
    from recipe.adapter.trainer import stop_token_ids

    trainer = over_sampled_trainer(tiny_artifacts, tmp_path / "run", tq_cluster)
    eos = min(stop_token_ids(trainer.tokenizer))
    rollout = trainer.agent_loop_manager

    class StoppedReplicas(FakeReplicas):
        def abort_replicas(self, reject_request=False):  # session 0 of every aborted group had stopped (EOS)
            super().abort_replicas(reject_request)
            items = tq_cluster.kv_list("train")["train"]
            stopped = [k for k, t in items.items() if k.endswith("_0_0") and t.get("response_len") == 3]
            recs = [{"responses": torch.tensor([7, 7, eos])} for _ in stopped]
            tq_cluster.kv_batch_put(keys=stopped, partition_id="train", fields=list_of_dict_to_tensordict(recs))

    trainer.checkpoint_manager = StoppedReplicas(rollout)
    run_step(trainer, tq_cluster, 1)
    aborted = trainer.over_sample.last_aborted
    assert aborted is not None and len(aborted.rows) == ROLLOUT_N * (math.ceil(TRAIN_BATCH * (1 + RATIO)) - TRAIN_BATCH)
    session0 = np.asarray(aborted.sample_index) == 0
    assert not aborted.aborted[session0].any() and aborted.aborted[~session0].all()
    assert not aborted.censored()[session0].any()
    record = read_records(tmp_path / "run" / "length_traces.jsonl")[1]
    tail = record["finish"][TRAIN_BATCH * ROLLOUT_N:]
    assert sorted(set(tail)) == ["abort", "eos"] and tail.count("eos") == int(session0.sum())


def test_a_rollout_gate_closes_for_the_launched_step_before_the_abort_and_opens_after_the_resume(
        tiny_artifacts, tmp_path, tq_cluster):
    """Multi-turn runs (``rollout_gate``): the settle closes the gate, for the step the launched rows carry
    (``rollout_step``), before vLLM's abort, so that step's trajectories in a tool call are cancelled and none starts
    a new turn; the resume opens it after generation is back. The trainer's one StepAbort does both."""
    trainer = over_sampled_trainer(tiny_artifacts, tmp_path / "run", tq_cluster)
    assert trainer.over_sample.abort is trainer.step_abort
    calls = trainer.checkpoint_manager.calls
    launched_steps = []

    class StepRollout(FakeRollout):
        def generate_sequences(self, batch):
            launched_steps.extend(batch[ROLLOUT_STEP].tolist())
            super().generate_sequences(batch)

    class Gate:
        def close(self, step):
            calls.append(("gate", "close", step))

        def open(self):
            calls.append(("gate", "open"))

    trainer.agent_loop_manager = StepRollout(tq_cluster)
    trainer.checkpoint_manager.rollout = trainer.agent_loop_manager
    trainer.step_abort.gate = Gate()
    run_step(trainer, tq_cluster, 4)
    assert set(launched_steps) == {4} and len(launched_steps) == math.ceil(TRAIN_BATCH * (1 + RATIO))
    names = [c if c[0] == "gate" else c[0] for c in calls]
    assert names.index(("gate", "close", 4)) == names.index("abort") - 1
    assert names[-2:] == ["resume", ("gate", "open")]


def test_groups_that_never_settle_after_the_abort_fail_the_step_by_name(tiny_artifacts, tmp_path, tq_cluster):
    """Replicas whose abort does not end the running groups: the settle's deadline fails the step, naming how many
    groups were left and what to check (rather than waiting for ever or training without them)."""
    trainer = over_sampled_trainer(tiny_artifacts, tmp_path / "run", tq_cluster)

    class DeafReplicas(FakeReplicas):
        def abort_replicas(self, reject_request=False):  # the running groups are never finished
            self.calls.append(("abort", reject_request))

    trainer.checkpoint_manager = DeafReplicas(trainer.agent_loop_manager)
    trainer.over_sample.settle_timeout_s = 0.0
    trainer.global_steps, trainer.timing_raw = 1, {}
    trainer.prepare_step()
    trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=TRAIN_BATCH)
    left = math.ceil(TRAIN_BATCH * (1 + RATIO)) - TRAIN_BATCH
    with pytest.raises(TimeoutError, match=rf"over-sample: {left} aborted groups did not settle within 0.0s .*abort "
                                           "handling"):
        trainer.on_sample_end()
    assert trainer.checkpoint_manager.calls == [("abort", True)]


def test_a_multi_turn_trajectory_that_records_where_to_resume_is_unfinished_even_after_eos(
        tiny_artifacts, tmp_path, tq_cluster, request):
    """Multi-turn ``continue``: a trajectory cut on a tool-call turn (its tool cancelled) ends in EOS like a finished
    one; its ``extra_fields`` say it was cut (``RESUME_AT``, CappedToolAgentLoop), so it is resumed and its length is
    a lower bound. One that finished (EOS, nothing recorded) is complete: returned as it was."""
    from recipe.adapter.trainer import stop_token_ids

    import ray

    from recipe.adapter.rollout_gate import GATE_ACTOR_NAME

    trainer = over_sampled_trainer(tiny_artifacts, tmp_path / "run", tq_cluster, "recipe.over_sample.requeue=continue",
                                   "actor_rollout_ref.rollout.multi_turn.enable=True")
    request.addfinalizer(lambda: ray.kill(ray.get_actor(GATE_ACTOR_NAME)))  # the run's gate: later tests have none
    assert trainer.over_sample.multi_turn
    eos = min(stop_token_ids(trainer.tokenizer))

    class TurnRollout(FakeRollout):  # records with the multi-turn fields the trainer reads
        def put_group(self, uid, row, n_tokens, fields):
            super().put_group(uid, row, n_tokens, {**fields, "num_turns": 2, "extra_fields": {}, "metrics": {}})

    class TurnReplicas(FakeReplicas):
        def abort_replicas(self, reject_request=False):  # every aborted trajectory ends in EOS; session 0 was cut
            super().abort_replicas(reject_request)
            items = tq_cluster.kv_list("train")["train"]
            keys = sorted(k for k, t in items.items() if not t.get("is_prompt") and t.get("response_len") == 3)
            recs = [{"responses": torch.tensor([7, 7, eos]),
                     "extra_fields": {RESUME_AT: {"stage": "tools"}} if k.endswith("_0_0") else {}} for k in keys]
            tq_cluster.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(recs))

    trainer.agent_loop_manager = TurnRollout(tq_cluster)
    trainer.checkpoint_manager = TurnReplicas(trainer.agent_loop_manager)
    run_step(trainer, tq_cluster, 1)

    refs = trainer.over_sample.partials
    assert len(refs) == math.ceil(TRAIN_BATCH * (1 + RATIO)) - TRAIN_BATCH
    assert all(ref.complete == [False, True] for ref in refs.values())
    aborted = trainer.over_sample.last_aborted
    assert aborted.aborted.tolist() == [s == 0 for s in aborted.sample_index]


def test_r3_the_kept_partial_records_hold_no_routes_across_the_step(tiny_artifacts, tmp_path, tq_cluster):
    """Routing replay with ``continue``: the aborted groups' records wait in TransferQueue for their resume, but their
    routes (768 B a token at Qwen3-30B-A3B scale) are never read again: the settle empties them; the trained
    groups' routes are untouched."""
    from recipe.adapter.routes import route_shape

    trainer = over_sampled_trainer(tiny_artifacts, tmp_path / "run", tq_cluster, "recipe.over_sample.requeue=continue",
                                   "actor_rollout_ref.rollout.enable_rollout_routing_replay=True")
    shape = route_shape(str(tiny_artifacts.model_dir))
    assert trainer.over_sample.route_shape == shape

    class RoutedRollout(FakeRollout):  # records with routes, one row per prompt + response token (verl's as_dict)
        def put_group(self, uid, row, n_tokens, fields):
            routes = torch.ones((3 + n_tokens, *shape), dtype=torch.int16)
            super().put_group(uid, row, n_tokens, {**fields, "routed_experts": routes})

    rollout = RoutedRollout(tq_cluster)
    trainer.agent_loop_manager, trainer.checkpoint_manager = rollout, FakeReplicas(rollout)
    trainer.global_steps, trainer.timing_raw = 1, {}
    trainer.prepare_step()
    batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=TRAIN_BATCH)
    trainer.on_sample_end()

    kept = [ref.key(s) for ref in trainer.over_sample.partials.values() for s in range(ROLLOUT_N)]
    assert len(kept) == (math.ceil(TRAIN_BATCH * (1 + RATIO)) - TRAIN_BATCH) * ROLLOUT_N
    held = tq_cluster.kv_batch_get(keys=kept, partition_id="train", select_fields=["routed_experts", "responses"])
    assert [len(r) for r in held["routed_experts"].unbind()] == [0] * len(kept)
    assert [len(r) for r in held["responses"].unbind()] == [3] * len(kept)  # what the resume reads is kept
    trained = tq_cluster.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["routed_experts"])
    assert all(len(r) > 3 for r in trained["routed_experts"].unbind())
    tq_cluster.kv_clear(keys=batch.keys, partition_id="train")
    trainer.on_step_end()
