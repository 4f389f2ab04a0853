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


def _sessions(rec: dict, row: int, trained: bool) -> dict[int, tuple[int, str]]:
    """A row's responses in one step's trace, trained (first ``BATCH * N``) or aborted: session -> (tokens, finish)."""
    part = slice(None, BATCH * N) if trained else slice(BATCH * N, None)
    return {s: (n, f) for r, s, n, f in zip(rec["rows"][part], rec["sample_index"][part], rec["lengths"][part],
                                            rec["finish"][part]) if r == row}


def test_continue_resumes_genuinely_unfinished_responses(continue_run):
    """Each response an abort cut mid-way (below that step's limit, no EOS: ``abort`` in the trace) in a group kept
    for resumption comes back the next step as its partial response followed by more: in the trained text verl
    dumps, or, where the resumed group loses the race again, in that abort's partial text; the trace has more tokens
    for it (the rest may be a lone EOS, which the text does not show). A response the abort found complete comes
    back as it was. A trained group with a resumed response spans two policy versions; a group that loses the race
    again has used its one resume (``max_resumes=1``) and restarts. Which responses an abort cuts is a race (most
    finish before the driver sees its batch complete), so every cut response of the run is checked, wherever it
    lands."""
    metrics, events, traces = continue_run.metrics(), continue_run.abort_events(), continue_run.traces()
    event_at = {(e["step"], e["dataset_item_idx"]): e for e in events}
    checked, spanning = 0, set()
    for event in events:
        step, row = event["step"], event["dataset_item_idx"]
        if not event["resumes_next"] or step + 1 not in traces:  # the last step: nothing resumes it
            continue
        before = _sessions(traces[step], row, trained=False)
        again = event_at.get((step + 1, row))
        if again is not None:  # lost again: no second resume; its abort shows the resumed text
            assert not again["resumes_next"], f"row {row} resumed twice"
            after = _sessions(traces[step + 1], row, trained=False)
            texts = {s["session"]: s["text"] for s in again["sessions"]}
        else:
            after = _sessions(traces[step + 1], row, trained=True)
            dump = continue_run.dumps / f"{step + 1}.jsonl"
            dumped = [t for t in map(json.loads, dump.read_text().splitlines()) if t["input"] == event["prompt"]]
            assert len(dumped) == N, f"row {row} resumed at step {step + 1}"
            texts = {int(t["uid"].rsplit("_", 2)[1]): t["output"] for t in dumped}
        assert sorted(after) == sorted(before) == list(range(N)) and sorted(texts) == list(range(N)), (step, row)
        for session in event["sessions"]:
            # a byte-level token may end mid-character
            s, partial = session["session"], session["text"].rstrip("\ufffd")
            (tokens, finish), (tokens_after, _) = before[s], after[s]
            assert tokens == session["tokens"] and texts[s].startswith(partial), (step, row, s)
            if finish == "abort":
                assert tokens_after > tokens, (step, row, s)
                checked += tokens > 0  # one still waiting for a slot when aborted resumes from nothing
                spanning |= set() if again is not None else {step + 1}
            else:
                assert tokens_after == tokens, f"row {row} session {s}: a complete response was regenerated"
    assert checked, "no response was cut mid-way by an abort and resumed"
    assert all(metrics[s]["training/off_policy/trajectory_spans/max"] == 2 for s in spanning)
    resumed = [s for s, m in metrics.items() if m["rollout/over_sample/resumed_groups"] > 0]
    assert set(resumed) >= spanning
