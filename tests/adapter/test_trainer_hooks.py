"""LengthAwareTrainer hooks driven with real verl objects on CPU.

What runs for real: verl's PPOTrainer/PPOTrainerSync constructors, ``_init_tokenizer``, ``_init_dataloader`` (then
our override), ``_next_train_batch`` (verl's fetch from the StatefulDataLoader + our fields), TransferQueue (a real
local Ray cluster with one storage unit) holding trajectory records written the way verl's AgentLoopWorkerTQ writes
them, and our ``observe_batch`` reading them back. What cannot run here: ``super().step()`` itself (Megatron
workers and vLLM servers need GPUs), so the tests call ``observe_batch`` with the batch meta that step would return.
"""
import json

import numpy as np
import pytest
import torch
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.adapter.columns import column_to_numpy
from recipe.adapter.fields import CAP, PREDICTION, ROLLOUT_STEP, ROW_ID
from recipe.adapter.sampler import LengthAwareEpochSampler

from recipe.route_record.config import ROLLOUT_N as N_RESP
from recipe.route_record.config import TRAIN_BATCH
from harness.trainers import make_trainer


def put_trajectories(tq, batch, lengths_of, preempted=None, tool_calls=None, extra=None):
    """Write one record per response as AgentLoopWorkerTQ._agent_loop_postprocess does: the agent-loop output
    fields (with verl's per-sample ``metrics`` when ``preempted`` gives num_preempted per response) plus the prompt's
    row fields (kwargs), keys ``{uid}_{session}_0``. ``tool_calls`` (row, session) -> calls makes them multi-turn
    records as CappedToolAgentLoop leaves them: ``num_turns``, the calls in ``extra_fields``, 1.5 s a call in verl's
    ``metrics.tool_calls``. ``extra`` (row, session) -> dict: the records' ``extra_fields``."""
    from transfer_queue import KVBatchMeta

    keys, fields, tags = [], [], []
    for i in range(len(batch)):
        row = {k: batch[k][i] for k in (ROW_ID, CAP, PREDICTION)}
        row[ROW_ID] = int(batch[ROW_ID][i])
        for s in range(N_RESP):
            n = int(lengths_of(row[ROW_ID], s))
            keys.append(f"{batch['uid'][i]}_{s}_0")
            metrics = {"metrics": {"num_preempted": preempted(row[ROW_ID], s)}} if preempted else {}
            if tool_calls is not None:
                calls = int(tool_calls(row[ROW_ID], s))
                metrics = {"metrics": {"tool_calls": 1.5 * calls}, "num_turns": 2 + 2 * calls,
                           "extra_fields": {"tool_calls": calls}}
            if extra is not None:
                metrics["extra_fields"] = {**metrics.get("extra_fields", {}), **extra(row[ROW_ID], s)}
            fields.append({"response_mask": torch.ones(n, dtype=torch.int64), **row, **metrics})
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


def test_warm_start_from_an_earlier_runs_traces_on_a_reordered_file(tiny_artifacts, tmp_path, tq_cluster):
    """Two epochs of a first run write traces; a second run on a re-ordered copy of the train file starts from them
    (data.sampler.init_from): rows are matched by prompt content, its epoch 0 is sorted by the carried estimates
    and capped, and each prediction is what the first run observed for that prompt in its first epoch."""
    import pandas as pd

    first = make_trainer(tiny_artifacts, tmp_path / "first")
    for step in range(1, 2 * first.steps_per_epoch + 1):
        first.global_steps = step
        batch = first._next_train_batch()
        meta = put_trajectories(tq_cluster, batch, lambda r, s: true_len(r, s) + 3 * (step > first.steps_per_epoch))
        first.observe_batch(meta, gen_time_s=1.0)
        tq_cluster.kv_clear(keys=meta.keys, partition_id="train")
    traces = tmp_path / "first" / "run" / "length_traces.jsonl"

    reordered = tmp_path / "reordered.parquet"
    df = pd.read_parquet(tiny_artifacts.train_parquet)
    df.sample(frac=1.0, random_state=3).reset_index(drop=True).to_parquet(reordered)
    second = make_trainer(tiny_artifacts, tmp_path / "second", f"data.train_files={reordered}",
                          f"data.sampler.init_from={traces}", "data.sampler.shuffle_batch_blocks=False",
                          "recipe.cap.factor=1.0")
    n_rows = second.length_sampler.num_rows
    assert second.warm_start.rows == n_rows == first.length_sampler.num_rows
    keys = first.train_dataset.prompt_keys()
    assert second.warm_start.responses == sum(keys.count(k) * N_RESP for k in keys)  # each row: its prompt's responses
    # row i of the re-ordered file holds the prompt of rows old_of[i] of the first run's file (the tiny set repeats
    # a prompt: such rows share all the responses of that prompt)
    first_keys = first.train_dataset.prompt_keys()
    old_of = [[j for j, k in enumerate(first_keys) if k == key] for key in second.train_dataset.prompt_keys()]
    assert [o[0] for o in old_of] != list(range(n_rows))
    carried = np.array([np.mean([true_len(r, 0) for r in rows]) + 0.5 for rows in old_of])  # epoch-0 group means
    assert np.allclose(second.length_sampler.estimates.value, carried)

    batch = second._next_train_batch()
    plan = second.length_sampler.plan
    assert plan.epoch == 0 and np.all(np.diff(carried[plan.order]) >= 0)  # epoch 0 sorted by the estimates
    rows = column_to_numpy(batch[ROW_ID], dtype=np.int64)
    assert np.allclose(batch[PREDICTION].numpy(), carried[rows])
    want_cap = max(16, int(np.ceil(1.0 * carried[rows].mean())))  # the seed formula (min_tokens=16, factor 1.0)
    assert want_cap < 64, "the test must exercise a binding cap"
    assert batch[CAP].tolist() == [want_cap] * TRAIN_BATCH  # capped from the first step


def test_longest_predicted_first_sets_priorities_and_dispatch_order(tiny_artifacts, tmp_path):
    """rollout.scheduling_policy=priority: each row's vLLM priority is minus its predicted length (lower runs
    first) and the batch goes out in that order; verl's default 0 otherwise."""
    from recipe.adapter.fields import PRIORITY

    trainer = make_trainer(tiny_artifacts, tmp_path, "actor_rollout_ref.rollout.scheduling_policy=priority",
                           "data.sampler.bucket_size=100000", "data.sampler.shuffle_batch_blocks=False")
    n_rows = trainer.length_sampler.num_rows
    trainer.length_sampler.estimates.warm_start(np.arange(n_rows), [true_len(r, 0) for r in range(n_rows)])
    batch = trainer._next_train_batch()
    pred = batch[PREDICTION].numpy()
    assert batch[PRIORITY].tolist() == (-np.round(pred)).astype(int).tolist()
    assert np.all(np.diff(pred) <= 0), "dispatched longest first"
    assert PRIORITY not in make_trainer(tiny_artifacts, tmp_path / "fcfs")._next_train_batch().keys()


def test_rows_without_an_estimate_get_the_prior_as_priority(tiny_artifacts, tmp_path):
    """A row nothing is known about runs where the population prior puts it (the middle of longest-first), not at
    priority 0, which would put it behind every row with a prediction."""
    trainer = make_trainer(tiny_artifacts, tmp_path, "actor_rollout_ref.rollout.scheduling_policy=priority")
    rows = np.arange(trainer.length_sampler.num_rows)
    est = trainer.length_sampler.estimates
    known, unknown = rows[::2], rows[1::2]
    est.warm_start(known, [true_len(r, 0) for r in known])
    prior = est.prior()
    assert np.isnan(est.get(unknown, fill_prior=False)).all() and prior > 0
    pri = trainer.row_priorities(rows)
    assert pri[known].tolist() == [-true_len(r, 0) for r in known]
    assert pri[unknown].tolist() == [-int(np.round(prior))] * len(unknown)


def test_groups_resumed_from_partial_responses_get_the_resumed_priority(tiny_artifacts, tmp_path):
    """Over-sample ``continue``: a row whose partial responses wait in TransferQueue gets ``RESUMED_PRIORITY``,
    ahead of every fresh row whatever its prediction (here the shortest, which would otherwise go last)."""
    from recipe.adapter.partial import PartialRef
    from recipe.adapter.trainer import RESUMED_PRIORITY

    trainer = make_trainer(tiny_artifacts, tmp_path, "actor_rollout_ref.rollout.scheduling_policy=priority",
                           "recipe.over_sample.enable=1", "recipe.over_sample.requeue=continue")
    rows = np.arange(trainer.length_sampler.num_rows)
    trainer.length_sampler.estimates.warm_start(rows, [true_len(r, 0) for r in rows])
    resumed = int(np.argmin([true_len(r, 0) for r in rows]))  # the shortest prediction: last, were it fresh
    trainer.over_sample.partials[resumed] = PartialRef(key_prefix="u", partition_id="train", complete=[False] * N_RESP,
                                                       min_version=1, resumes=1, has_logprobs=False)
    pri = trainer.row_priorities(rows)
    assert pri[resumed] == RESUMED_PRIORITY
    assert [p for r, p in enumerate(pri.tolist()) if r != resumed] == [-true_len(r, 0) for r in rows if r != resumed]


def test_budget_cap_warm_started_caps_the_first_epoch(tiny_artifacts, tmp_path, tq_cluster):
    """recipe.cap.mode=budget through the trainer: calibrated on an earlier run's traces, it caps every batch of
    epoch 0 exactly as the same calibration on the responses that run was given does (the settings' budget, align
    and min_tokens reaching the cap, the traces' entries matched and fed as they should be)."""
    first = make_trainer(tiny_artifacts, tmp_path / "first")
    for step in range(1, 2 * first.steps_per_epoch + 1):
        first.global_steps = step
        batch = first._next_train_batch()
        meta = put_trajectories(tq_cluster, batch, true_len, preempted=lambda r, s: r % 3)
        first.observe_batch(meta, gen_time_s=1.0)
        tq_cluster.kv_clear(keys=meta.keys, partition_id="train")
    traces = tmp_path / "first" / "run" / "length_traces.jsonl"
    record = json.loads(traces.read_text().splitlines()[0])
    assert record["num_preempted"] == [r % 3 for r in record["rows"]]  # verl's per-sample metric, kept
    second = make_trainer(tiny_artifacts, tmp_path / "second", f"data.sampler.init_from={traces}",
                          "recipe.cap.mode=budget", "recipe.cap.budget.budget=0.05", "recipe.cap.budget.align=4",
                          "recipe.cap.budget.min_tokens=8")
    assert type(second.cap_policy).__name__ == "BudgetCap" and second.warm_start.cap_responses > 0
    # the same calibration from the responses the first run was given (rows sharing a prompt share its responses):
    # epoch 1 predicted by epoch 0, every response an exact length (all < 64, so none hit the first run's cap)
    from recipe.core.cap import BudgetCap, warm_start_cap

    keys = first.train_dataset.prompt_keys()
    entries = [(epoch, i, true_len(j, s)) for epoch in (0, 1) for i, key in enumerate(keys)
               for j, other in enumerate(keys) if other == key for s in range(N_RESP)]
    epochs, rows, lengths = (np.array(column) for column in zip(*entries))
    ref = BudgetCap(64, budget=0.05, align=4, min_tokens=8)
    assert warm_start_cap(ref, rows, lengths, np.zeros(len(rows), bool), epochs, response_length=64,
                          ema_decay=second.settings.sampler.ema_decay,
                          statistic=second.settings.sampler.statistic) == second.warm_start.cap_responses
    caps, wants = [], []
    for step in range(1, second.steps_per_epoch + 1):  # every batch of epoch 0 (nothing observed in between)
        second.global_steps = step
        batch = second._next_train_batch()
        caps.append(batch[CAP].tolist())
        wants.append([ref.cap_for_batch(batch[PREDICTION].numpy())] * TRAIN_BATCH)
    assert caps == wants
    assert all(8 < c[0] < 64 for c in wants) and len({c[0] for c in wants}) > 1, "binding caps, above the floor"


def test_training_rows_carry_their_step_and_the_tail_cut_closes_the_gate_for_it(tiny_artifacts, tmp_path):
    """Each training row carries the step it is launched for (``rollout_step``, the only step whose abort may cut
    it); the tail cut watches that step, through the trainer's one StepAbort."""
    trainer = make_trainer(tiny_artifacts, tmp_path, "recipe.tail_cut.enable=1")
    assert trainer.tail_cut.abort is trainer.step_abort
    trainer.global_steps = 5
    batch = trainer._next_train_batch()
    assert batch[ROLLOUT_STEP].dtype == torch.int64 and batch[ROLLOUT_STEP].tolist() == [5] * TRAIN_BATCH
    started = {}
    trainer.tail_cut.start = lambda manager, uids, level, step=None: started.update(uids=uids, step=step)
    trainer.checkpoint_manager = None
    trainer.on_sample_begin()
    assert started == {"uids": [str(u) for u in batch["uid"]], "step": 5}


def test_responses_stopped_by_the_tail_cut_are_traced_as_cut_and_censored(tiny_artifacts, tmp_path, tq_cluster):
    trainer = make_trainer(tiny_artifacts, tmp_path, "recipe.tail_cut.enable=1", "recipe.tail_cut.fraction=0.9")
    batch = trainer._next_train_batch()
    meta = put_trajectories(tq_cluster, batch, lambda r, s: 40 if s == 0 else 7)  # session 1 was cut at 7 tokens
    trainer.tail_cut.done_at_cut = {k for k in meta.keys if k.rsplit("_", 2)[1] == "0"}
    trainer.observe_batch(meta, gen_time_s=1.0)
    record = json.loads((tmp_path / "run" / "length_traces.jsonl").read_text().splitlines()[-1])
    assert record["finish"] == ["eos" if s == 0 else "cut" for s in record["sample_index"]]
    est = trainer.length_sampler.estimates
    row = record["rows"][0]
    assert est.value[row] == 23.5 and est.censored[row]  # the group's mean holds a lower bound: itself one


def test_order_by_time_feeds_tool_calls_into_the_sampler_and_sorts_by_expected_time(tiny_artifacts, tmp_path,
                                                                                    tq_cluster):
    """Multi-turn steps with data.sampler.order_by=time: each trajectory's tool calls and tool seconds reach the
    sampler's time key, the step logs the mean tool latency, the next epoch is sorted by expected time (not by
    tokens), and a run warm-started from these traces starts with the same tool-call estimates and latency."""
    def calls_of(r, s):
        return (2 + s) * (r % 3 == 0)  # every third row: 2 and 3 calls

    first = make_trainer(tiny_artifacts, tmp_path / "first", "data.sampler.order_by=time",
                         "data.sampler.time_tokens_per_s=10", "data.sampler.shuffle_batch_blocks=False")
    first.multi_turn = True  # what rollout.multi_turn.enable sets (no tool config needed to read the records)
    for step in range(1, first.steps_per_epoch + 1):
        first.global_steps = step
        meta = put_trajectories(tq_cluster, first._next_train_batch(), true_len, tool_calls=calls_of)
        metrics = first.observe_batch(meta, gen_time_s=1.0)
        tq_cluster.kv_clear(keys=meta.keys, partition_id="train")
    sampler = first.length_sampler
    rows = np.arange(sampler.num_rows)
    calls = np.array([2.5 * (r % 3 == 0) for r in rows])  # the mean of a row's two responses
    assert metrics["sampler/mean_tool_latency_s"] == 1.5
    assert np.allclose(sampler.time_key.calls.value, calls)
    tokens = np.array([true_len(r, 0) + 0.5 for r in rows])
    assert np.allclose(sampler.estimates.value, tokens)  # the token estimates: what caps and priorities read
    key = tokens + calls * 1.5 * 10
    first.global_steps += 1
    first._next_train_batch()
    order = sampler.plan.order
    assert sampler.plan.epoch == 1 and np.all(np.diff(key[order]) >= 0)
    assert not np.all(np.diff(tokens[order]) >= 0), "the case must order differently by time than by tokens"
    record = json.loads((tmp_path / "first" / "run" / "length_traces.jsonl").read_text().splitlines()[0])
    assert record["tool_calls"] == [calls_of(r, s) for r, s in zip(record["rows"], record["sample_index"])]

    traces = tmp_path / "first" / "run" / "length_traces.jsonl"
    second = make_trainer(tiny_artifacts, tmp_path / "second", "data.sampler.order_by=time",
                          f"data.sampler.init_from={traces}", "data.sampler.shuffle_batch_blocks=False")
    warm = second.length_sampler.time_key
    assert second.warm_start.tool_rows == sampler.num_rows and warm.calls.seen.all()
    assert (warm.latency_sum_s, warm.latency_calls) == (sampler.time_key.latency_sum_s,
                                                        sampler.time_key.latency_calls)
    second._next_train_batch()
    plan = second.length_sampler.plan
    assert plan.epoch == 0 and np.all(np.diff(warm.filled()[plan.order]) >= 0)  # epoch 0 sorted by expected time
    tokens_run = make_trainer(tiny_artifacts, tmp_path / "third", f"data.sampler.init_from={traces}")
    assert tokens_run.length_sampler.time_key is None and tokens_run.warm_start.tool_rows == 0


def test_single_turn_steps_feed_no_tool_calls_and_order_by_tokens_logs_no_latency(tiny_artifacts, tmp_path,
                                                                                   tq_cluster):
    timed = make_trainer(tiny_artifacts, tmp_path / "time", "data.sampler.order_by=time")
    meta = put_trajectories(tq_cluster, timed._next_train_batch(), true_len)
    metrics = timed.observe_batch(meta, gen_time_s=1.0)
    tq_cluster.kv_clear(keys=meta.keys, partition_id="train")
    seen = timed.length_sampler.estimates.seen
    assert seen.any() and np.array_equal(timed.length_sampler.time_key.calls.seen, seen)
    assert (timed.length_sampler.time_key.calls.value[seen] == 0).all()  # observed: no calls
    assert metrics["sampler/mean_tool_latency_s"] == 0.0

    plain = make_trainer(tiny_artifacts, tmp_path / "tokens")
    meta = put_trajectories(tq_cluster, plain._next_train_batch(), true_len)
    metrics = plain.observe_batch(meta, gen_time_s=1.0)
    assert plain.length_sampler.time_key is None and "sampler/mean_tool_latency_s" not in metrics


def test_mismatch_reads_the_trained_tokens_and_leaves_out_misaligned_records(tq_cluster):
    """rollout/mismatch/*: the trainer's against the rollout's log-probs on the masked (trained) tokens only, from the
    records as verl leaves them in TransferQueue (nested, one length per response); a record whose log-probs do not
    line up with its mask is counted, never guessed at."""
    from transfer_queue import KVBatchMeta

    from recipe.adapter.trainer import MISALIGNED, LengthAwareTrainer
    from recipe.core.mismatch import K3, OUT_OF_BAND

    ln2 = float(np.log(2.0))
    records = [  # (trainer's, rollout's, mask): d = 0, ln 2 + 0.1 (out of band), a masked-out huge gap, ln 2 - 0.1
        ([-1.0, -1.0, -9.0], [-1.0, -1.1 - ln2, 0.0], [1, 1, 0]),
        ([-2.0], [-1.9 - ln2], [1]),
        ([-1.0, -1.0], [-1.0], [1, 1]),  # misaligned
    ]
    fields = [{"old_log_probs": torch.tensor(t), "rollout_log_probs": torch.tensor(r),
               "response_mask": torch.tensor(m, dtype=torch.int64), "extra_fields": {}} for t, r, m in records]
    keys = [f"mm_{i}_0" for i in range(len(records))]
    tags = [{"status": "success", "response_len": len(m)} for _, _, m in records]
    tq_cluster.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    out = LengthAwareTrainer.mismatch(None, KVBatchMeta(partition_id="train", keys=keys, tags=tags))
    d = np.array([0.0, ln2 + 0.1, ln2 - 0.1], dtype=np.float32).astype(np.float64)
    assert out[K3] == pytest.approx(float(np.mean(np.expm1(d) - d)), rel=1e-5)
    assert out[OUT_OF_BAND] == pytest.approx(1 / 3)
    assert out[MISALIGNED] == 1.0


def test_mismatch_leaves_out_a_resumed_responses_stale_tokens(tq_cluster):
    """Over-sample ``continue``: a resumed response's stored tokens are trained (``mask_stale_tokens`` off) but were
    sampled by an older policy; their gap is the policy's move, not the engine's, and stays out of
    rollout/mismatch/* (counted in its own metric)."""
    from transfer_queue import KVBatchMeta

    from recipe.adapter.partial import STALE
    from recipe.adapter.trainer import STALE_EXCLUDED, LengthAwareTrainer
    from recipe.core.mismatch import K3, OUT_OF_BAND

    records = [  # 3 stale tokens with a 1-nat gap each (one of them a tool reply, mask 0), then 2 fresh, exact
        ([-1.0] * 5, [-2.0, -2.0, -2.0, -1.0, -1.0], [1, 0, 1, 1, 1], {STALE: 3}),
        ([-1.0, -1.0], [-1.0, -1.0], [1, 1], {}),
    ]
    fields = [{"old_log_probs": torch.tensor(t), "rollout_log_probs": torch.tensor(r),
               "response_mask": torch.tensor(m, dtype=torch.int64), "extra_fields": e} for t, r, m, e in records]
    keys = [f"st_{i}_0" for i in range(len(records))]
    tags = [{"status": "success", "response_len": len(m)} for _, _, m, _ in records]
    tq_cluster.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    out = LengthAwareTrainer.mismatch(None, KVBatchMeta(partition_id="train", keys=keys, tags=tags))
    assert out[K3] == 0.0 and out[OUT_OF_BAND] == 0.0  # the 4 fresh tokens agree exactly
    assert out[STALE_EXCLUDED] == 2.0  # the stale trained tokens; the tool reply was never trained


def test_r3_steps_log_the_trained_tokens_left_out_for_lack_of_routes(tiny_artifacts, tmp_path, tq_cluster):
    """``rollout/routes/unrouted_masked_tokens``: the step's sum of what the loops masked (``extra_fields``), a
    metric beside the log's warning."""
    from recipe.adapter.routes import UNROUTED, UNROUTED_METRIC

    trainer = make_trainer(tiny_artifacts, tmp_path, "actor_rollout_ref.rollout.enable_rollout_routing_replay=True")
    batch = trainer._next_train_batch()
    unrouted = lambda r, s: {UNROUTED: 3} if (r + s) % 3 == 0 else {}  # noqa: E731
    meta = put_trajectories(tq_cluster, batch, true_len, extra=unrouted)
    metrics = trainer.observe_batch(meta, gen_time_s=1.0)
    rows = [int(r) for r in batch[ROW_ID]]
    assert metrics[UNROUTED_METRIC] == 3.0 * sum((r + s) % 3 == 0 for r in rows for s in range(N_RESP)) > 0
    plain = make_trainer(tiny_artifacts, tmp_path / "plain")
    assert UNROUTED_METRIC not in plain.observe_batch(meta, gen_time_s=1.0)
