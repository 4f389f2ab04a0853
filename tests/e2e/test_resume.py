"""Resume through verl: the resampler run was killed with SIGKILL mid-epoch, after a checkpoint, and relaunched with
the same command (tests/e2e/conftest.py). The relaunch continues exactly as the uninterrupted run did: the steps
the killed launch had already completed after the checkpoint come out identical when redone (same rows in the same
order, same predictions, caps and lengths: ``ROLLOUT_SAMPLING_SEED`` makes the rollouts reproducible), and the rest
of the interrupted epoch follows the order saved in verl's ``data.pt``."""
import numpy as np
import torch

from recipe.cpu.preset import CPU_VALUES

BATCH = int(CPU_VALUES["TRAIN_BATCH_SIZE"])
PER_RESPONSE = ("lengths", "finish", "predicted", "prompt_keys")


def by_response(rec: dict) -> dict:
    """(row, sample index) -> what the trace recorded for that response (a record lists the responses in the order
    verl's replay buffer returned them, which follows completion)."""
    return {(r, s): tuple(rec[f][i] for f in PER_RESPONSE)
            for i, (r, s) in enumerate(zip(rec["rows"], rec["sample_index"]))}


def test_kill_9_mid_epoch_then_relaunch_continues_like_the_uninterrupted_run(resampler_run):
    killed, run_dir = resampler_run.killed, resampler_run.run_dir
    assert f"Resuming from {run_dir}/global_step_{killed.checkpoint}" in resampler_run.output
    uninterrupted = killed.steps_after_checkpoint
    assert uninterrupted and uninterrupted[0] == killed.checkpoint + 1
    assert max(uninterrupted) < 12, "killed mid-epoch (epoch 1 is steps 7-12)"
    redone = resampler_run.traces()
    for step in uninterrupted:
        before, after = killed.traces[step], redone[step]
        assert (after["epoch"], after["cap"]) == (before["epoch"], before["cap"]), f"step {step}"
        assert by_response(after) == by_response(before), f"step {step}: the responses differ after the resume"


def test_resumed_epoch_follows_the_order_in_the_checkpoint(resampler_run):
    """What verl restored (the sampler's state in global_step_8/data.pt) is what the relaunch trained: the rest of
    epoch 1 in the saved order, with the saved estimates as the predictions of step 9."""
    checkpoint = resampler_run.killed.checkpoint
    state = torch.load(resampler_run.run_dir / f"global_step_{checkpoint}" / "data.pt", weights_only=False)
    sampler = next(v for _, v in _walk(state) if isinstance(v, dict) and "plan" in v and "num_rows" in v)
    plan = sampler["plan"]
    order, position = np.asarray(plan["order"]), int(plan["position"])
    assert position == 2 * BATCH  # two of epoch 1's six steps were trained before the checkpoint
    traces = resampler_run.traces()
    for i, step in enumerate(range(checkpoint + 1, 13)):
        batch = order[position + i * BATCH: position + (i + 1) * BATCH]
        assert set(traces[step]["rows"]) == set(batch.tolist()), f"step {step} trained another batch"
    rows = np.array(traces[checkpoint + 1]["rows"])
    saved = np.asarray(plan["estimates"]["value"])[rows]
    assert np.allclose(traces[checkpoint + 1]["predicted"], saved, atol=1e-3)


def _walk(obj, key=None):
    """(key, value) for every nested mapping entry of torchdata's state dict (its layout is torchdata's)."""
    yield key, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, k)
