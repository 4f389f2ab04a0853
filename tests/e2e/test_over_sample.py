"""Over-sample then abort through verl's real vLLM server (``vLLMHttpServer``, ``abort_replicas`` /
``resume_generation_replicas``), both re-queue modes: ``continue`` through the main command, ``restart`` in the
control run (conftest.py). vLLM runs the 40 sequences of a launch (10 groups x 4) 16 at a time, so the groups that
lose the race are still generating or waiting when they are aborted."""
import json

import pytest

from recipe.cpu.preset import CPU_VALUES, N_TRAIN

BATCH, N = int(CPU_VALUES["TRAIN_BATCH_SIZE"]), int(CPU_VALUES["ROLLOUT_N"])
STEPS_PER_EPOCH = N_TRAIN // BATCH


@pytest.fixture(params=["continue_run", "restart_without_sync_run"], ids=["continue", "restart"])
def os_run(request):
    """(mode, run); the parameter is the run's fixture name, which tells conftest.py to start that run."""
    return ("continue" if request.param == "continue_run" else "restart"), request.getfixturevalue(request.param)


def test_every_prompt_trained_once_per_epoch_and_aborts_leave_nothing_running(os_run):
    mode, run = os_run
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


def test_continue_resumes_genuinely_unfinished_responses(continue_run):
    """A group aborted with every response unfinished (below that step's limit, no EOS: ``abort`` in the trace) is
    resumed by the next step: each trained response is the partial response it was aborted with followed by the
    rest (verl's dump of the trained text starts with the aborted text, the trace has more tokens for each: the
    rest may be a lone EOS, which the text does not show) and spans two policy versions.
    A resumed group that loses the race again has used its one resume (``max_resumes=1``) and restarts."""
    metrics, events, traces = continue_run.metrics(), continue_run.abort_events(), continue_run.traces()
    aborted_at = {(e["step"], e["dataset_item_idx"]) for e in events}
    checked, spanning = 0, set()
    for event in events:
        step, row = event["step"], event["dataset_item_idx"]
        rec = traces[step]
        finish = [f for r, f in zip(rec["rows"][BATCH * N:], rec["finish"][BATCH * N:]) if r == row]
        if not event["resumes_next"] or finish != ["abort"] * N or step + 1 not in traces:  # last step: no resume
            continue
        if (step + 1, row) in aborted_at:  # lost again: no second resume
            assert not next(e for e in events if (e["step"], e["dataset_item_idx"]) == (step + 1, row))["resumes_next"]
            continue
        dump = continue_run.dumps / f"{step + 1}.jsonl"
        trained = [json.loads(line) for line in dump.read_text().splitlines()]
        for session in event["sessions"]:
            match = [t for t in trained
                     if t["input"] == event["prompt"] and int(t["uid"].rsplit("_", 2)[1]) == session["session"]]
            assert len(match) == 1, f"row {row} resumed at step {step + 1}"
            partial = session["text"].rstrip("\ufffd")  # a byte-level token may end mid-character
            assert match[0]["output"].startswith(partial)
        nxt = traces[step + 1]
        lengths = sorted(n for r, n in zip(nxt["rows"][:BATCH * N], nxt["lengths"][:BATCH * N]) if r == row)
        # if each session's response grew, the sorted lengths dominate the sorted partial lengths
        assert all(a > b for a, b in zip(lengths, sorted(s["tokens"] for s in event["sessions"]))), (row, lengths)
        checked += 1
        spanning.add(step + 1)
    assert checked, "no group was aborted mid-response and trained after its resume"
    assert all(metrics[s]["training/off_policy/trajectory_spans/max"] == 2 for s in spanning)
    resumed = [s for s, m in metrics.items() if m["rollout/over_sample/resumed_groups"] > 0]
    assert set(resumed) >= spanning
