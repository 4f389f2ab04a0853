"""Over-sample then abort through verl's real vLLM server (``vLLMHttpServer``, ``abort_replicas`` /
``resume_generation_replicas``), both re-queue modes.

``ROLLOUT_MAX_NUM_SEQS=16`` makes vLLM run the 40 sequences of a launch (10 groups x 4) in waves, so the groups
that lose the race are still generating (or waiting) when they are aborted: their partial responses are genuinely
unfinished, which is what ``continue`` must resume.
"""
import json

import pytest

from recipe.cpu.preset import CPU_VALUES, N_TRAIN
from recipe.testing.cpu_runs import require_success

BATCH, N = int(CPU_VALUES["TRAIN_BATCH_SIZE"]), int(CPU_VALUES["ROLLOUT_N"])
STEPS = N_TRAIN // BATCH + 2  # one epoch and two steps into the next
ENV = {"OVER_SAMPLE_ENABLE": "1", "OVER_SAMPLE_RATIO": "0.25", "ROLLOUT_MAX_NUM_SEQS": "16", "TOTAL_EPOCHS": "2"}


def over_sampled(launcher, mode: str):
    name = f"os-{mode}"
    dumps = launcher.base / name / "rollouts"
    run = launcher.run(name, {**ENV, "OVER_SAMPLE_REQUEUE": mode},
                       args=(f"trainer.total_training_steps={STEPS}", "recipe.over_sample.abort_events=1",
                             f"trainer.rollout_data_dir={dumps}"))
    run.dumps = dumps
    return require_success(run)


@pytest.fixture(scope="module", params=["restart", "continue"])
def os_run(request, launcher):
    return request.param, over_sampled(launcher, request.param)


def test_every_prompt_trained_once_per_epoch_and_aborts_leave_nothing_running(os_run):
    mode, run = os_run
    assert run.experiment == "cpu-grpo-resampler-os"
    metrics, traces = run.metrics(), run.traces()
    assert sorted(metrics) == list(range(1, STEPS + 1))
    trained = {}
    aborted_steps = 0
    for step, rec in traces.items():
        m = metrics[step]
        kept = [r for r, f in zip(rec["rows"], rec["finish"]) if f != "abort"] if "abort" in rec["finish"] else rec["rows"]
        trained_rows = set(rec["rows"][:BATCH * N])  # trained responses come first in a record, aborted ones after
        assert len(trained_rows) == BATCH and len(rec["rows"][:BATCH * N]) == BATCH * N
        trained.setdefault(rec["epoch"], []).extend(trained_rows)
        if m["rollout/over_sample/aborted_groups"] > 0:
            aborted_steps += 1
            assert m["rollout/over_sample/engine_unfinished_after_settle"] == 0, f"step {step}"
            aborted = rec["rows"][BATCH * N:]
            assert len(set(aborted)) == m["rollout/over_sample/aborted_groups"], f"step {step}"
            assert not set(aborted) & trained_rows
        assert kept  # a step always trains
    assert aborted_steps >= N_TRAIN // BATCH - 2, "most steps of an epoch over-sample and abort"
    assert sorted(trained[0]) == list(range(N_TRAIN)), "epoch 0: every prompt trained exactly once"
    assert len(trained[1]) == len(set(trained[1])) == 2 * BATCH
    last_of_epoch = metrics[N_TRAIN // BATCH]
    assert last_of_epoch["rollout/over_sample/launched_groups"] == BATCH  # nothing left to over-sample from
    events = [json.loads(line) for line in (run.run_dir / "over_sample_events.jsonl").read_text().splitlines()]
    assert len(events) == sum(m["rollout/over_sample/aborted_groups"] for m in metrics.values())


def test_restart_regenerates_and_continue_resumes_unfinished_responses(os_run):
    """``restart``: an aborted prompt is generated afresh later (one policy version per trained response).
    ``continue``: the next step resumes it; its trained response is the partial response it was aborted with
    followed by the rest (verl's dump of the trained text starts with the aborted text), spanning two versions."""
    mode, run = os_run
    metrics = run.metrics()
    events = [json.loads(line) for line in (run.run_dir / "over_sample_events.jsonl").read_text().splitlines()]
    spans = {s: metrics[s].get("training/off_policy/trajectory_spans/max") for s in metrics}
    if mode == "restart":
        assert all(m["rollout/over_sample/resumed_groups"] == 0 for m in metrics.values())
        assert not any(e["resumes_next"] for e in events)
        assert set(spans.values()) == {1}
        return
    unfinished = [(e, s) for e in events if e["resumes_next"] for s in e["sessions"]
                  if 0 < s["tokens"] < int(CPU_VALUES["MAX_RESPONSE_LENGTH"])]
    assert unfinished, "some aborted responses were genuinely unfinished"
    checked = 0
    for event, session in unfinished:
        dump = run.dumps / f"{event['step'] + 1}.jsonl"
        trained = [json.loads(line) for line in dump.read_text().splitlines()]
        match = [t for t in trained if t["input"] == event["prompt"] and int(t["uid"].rsplit("_", 2)[1]) == session["session"]]
        assert len(match) == 1, f"resumed group of row {event['dataset_item_idx']} trained at step {event['step'] + 1}"
        partial = session["text"].rstrip("\ufffd")  # a byte-level token may end mid-character
        assert match[0]["output"].startswith(partial) and len(match[0]["output"]) > len(partial)
        checked += 1
    resumed_steps = [s for s, m in metrics.items() if m["rollout/over_sample/resumed_groups"] > 0]
    assert resumed_steps and all(spans[s] == 2 for s in resumed_steps)
    assert checked >= 1
