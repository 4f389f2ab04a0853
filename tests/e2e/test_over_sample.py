"""Over-sample then abort through verl's real vLLM server (``vLLMHttpServer``, ``abort_replicas`` /
``resume_generation_replicas``) on the single-turn preset, re-queue mode ``restart``, in the control run
(conftest.py). vLLM runs the 40 sequences of a launch (10 groups x 4) 16 at a time, so the groups that lose the race
are still generating or waiting when they are aborted. Mode ``continue`` runs through verl's server in the multi-turn
over-sample launch (tests/e2e/test_multi_turn.py: trajectories cut mid-turn and mid-tool, resumed from where they
were cut, one more policy version in their group), and at the token level for single-turn responses on a real
engine in tests/adapter/test_oversample_engine.py: a launch of its own added ~3 CPU-minutes to the full tier and
proved no code path those two do not."""
from recipe.cpu.preset import CPU_VALUES, N_TRAIN

BATCH, N = int(CPU_VALUES["TRAIN_BATCH_SIZE"]), int(CPU_VALUES["ROLLOUT_N"])
STEPS_PER_EPOCH = N_TRAIN // BATCH


def test_every_prompt_trained_once_per_epoch_and_aborts_leave_nothing_running(restart_without_sync_run):
    run = restart_without_sync_run
    metrics, traces = run.metrics(), run.traces()
    trained = {}
    aborting_steps = 0
    for step, rec in traces.items():
        m = metrics[step]
        kept = rec["rows"][:BATCH * N]  # a record lists the trained responses first, then the aborted ones
        assert len(set(kept)) == BATCH and all(f != "abort" for f in rec["finish"][:BATCH * N])
        trained.setdefault(rec["epoch"], []).extend(set(kept))
        aborted = rec["rows"][BATCH * N:]
        assert len(set(aborted)) == m["rollout/over_sample/aborted_groups"], f"step {step}"
        assert not set(aborted) & set(kept)
        if aborted:
            aborting_steps += 1
            assert m["rollout/over_sample/engine_unfinished_after_settle"] == 0, f"step {step}: requests left"
    assert aborting_steps >= STEPS_PER_EPOCH - 2, "most steps of an epoch over-sample and abort"
    assert sorted(trained[0]) == list(range(N_TRAIN)), "epoch 0: every prompt trained exactly once"
    assert len(trained[1]) == len(set(trained[1])) == (len(traces) - STEPS_PER_EPOCH) * BATCH
    assert metrics[STEPS_PER_EPOCH]["rollout/over_sample/launched_groups"] == BATCH  # nothing left to over-sample
    assert len(run.abort_events()) == sum(m["rollout/over_sample/aborted_groups"] for m in metrics.values())


def test_restart_regenerates_aborted_prompts(restart_without_sync_run):
    metrics, events = restart_without_sync_run.metrics(), restart_without_sync_run.abort_events()
    assert events and not any(e["resumes_next"] for e in events)
    assert all(m["rollout/over_sample/resumed_groups"] == 0 for m in metrics.values())
    assert {m["training/off_policy/trajectory_spans/max"] for m in metrics.values()} == {1}
