"""Resume through verl: a run killed with SIGKILL mid-epoch, after a checkpoint, and relaunched with the same command
continues exactly as the uninterrupted run did: the rest of the interrupted epoch in the same order, with the same
estimates, caps and seeds (``ROLLOUT_SAMPLING_SEED`` makes the rollouts reproducible), through verl's own
checkpoint manager and ``data.pt``. The uninterrupted reference is ``resampler_run`` (same variables)."""
import os
import signal
import time

from recipe.testing.cpu_runs import marked_pids, require_success

CHECKPOINT, SAVE_EVERY = 12, 4  # killed while step 14 runs: mid-epoch 1 (steps 9-16), after global_step_12
ENV = {"SAVE_CKPT_ENABLE": "1", "TRAINER_SAVE_FREQ": str(SAVE_EVERY), "MAX_CKPT_TO_KEEP": "10"}


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_kill_9_mid_epoch_then_relaunch_continues_like_the_uninterrupted_run(launcher, resampler_run):
    from recipe.traces import read_records

    proc, ckpt_root, marker = launcher.start("resume", ENV)
    run_dir = ckpt_root / "cpu-grpo-resampler"
    tracker, traces = run_dir / "latest_checkpointed_iteration.txt", run_dir / "length_traces.jsonl"

    def mid_step_after_checkpoint():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be killed:\n{proc.log_path.read_text()[-4000:]}")
        return (tracker.is_file() and tracker.read_text().strip() == str(CHECKPOINT) and traces.is_file()
                and CHECKPOINT + 1 in read_records(traces))

    wait_for(mid_step_after_checkpoint, 900, f"global_step_{CHECKPOINT} and step {CHECKPOINT + 1}")
    for pid in marked_pids(marker):  # everything at once, as a node failure would
        os.kill(pid, signal.SIGKILL)
    assert launcher.wait(proc, timeout_s=60) is not None
    killed_at = max(read_records(traces))
    assert CHECKPOINT < killed_at < 16, "killed mid-epoch, after the checkpoint"

    relaunched = require_success(launcher.run("resume", ENV))
    assert f"Resuming from {run_dir}/global_step_{CHECKPOINT}" in relaunched.output
    assert len(list((run_dir / "logs").glob("metrics.*.jsonl"))) == 2  # each launch its own log: none truncated

    resumed, reference = relaunched.traces(), resampler_run.traces()
    assert sorted(resumed) == sorted(reference)
    fields = ("epoch", "rows", "sample_index", "lengths", "finish", "cap", "predicted")
    for step in range(CHECKPOINT + 1, max(reference) + 1):
        for f in fields:
            assert resumed[step][f] == reference[step][f], f"step {step}: {f} differs after the resume"
    # the same run before the kill: the steps up to the checkpoint match the reference too
    for step in range(1, CHECKPOINT + 1):
        assert resumed[step]["rows"] == reference[step]["rows"] and resumed[step]["lengths"] == reference[step]["lengths"]
