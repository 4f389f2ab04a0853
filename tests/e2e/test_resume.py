"""Resume through verl: the multi-turn resume run was killed with SIGKILL mid-epoch, after a checkpoint, and
relaunched with the same command (tests/e2e/conftest.py ``multi_turn_resume_run``). Both launches are the bare main
command; the relaunch resumes from the checkpoint and the rest of the interrupted epoch follows the order saved in
verl's ``data.pt`` (that the redone steps come out identical, tool calls and all, is
tests/e2e/test_multi_turn.py's ``test_kill_9_then_relaunch_redoes_the_multi_turn_steps_exactly``). One killed run
serves both presets: the sampler, its checkpoint and verl's resume are the same code for single- and multi-turn."""
import numpy as np
import torch

from recipe.cpu.preset import CPU_VALUES

BATCH = int(CPU_VALUES["TRAIN_BATCH_SIZE"])


def test_both_launches_are_the_main_command_and_the_relaunch_resumes(multi_turn_resume_run):
    run, killed = multi_turn_resume_run, multi_turn_resume_run.killed
    for out in (killed.output, run.output):
        assert "running the CPU preset (PRESET=cpu)" in out and "preflight: OK" in out
    assert "Training from scratch" in killed.output
    assert f"Resuming from {run.run_dir}/global_step_{killed.checkpoint}" in run.output
    assert max(killed.steps_after_checkpoint) < 12, "killed mid-epoch (epoch 1 is steps 7-12)"
    # one log of each kind per launch: the relaunch truncates none of the first launch's
    assert len(list((run.run_dir / "logs").glob("metrics.*.jsonl"))) == 2
    assert len(list((run.run_dir / "logs").glob("console.*.log"))) == 2
    assert f"finished with status 0; run dir {run.run_dir}" in run.output


def test_resumed_epoch_follows_the_order_in_the_checkpoint(multi_turn_resume_run):
    """What verl restored (the sampler's state in global_step_8/data.pt) is what the relaunch trained: the rest of
    epoch 1 in the saved order, with the saved estimates as the predictions of step 9."""
    run = multi_turn_resume_run
    checkpoint = run.killed.checkpoint
    state = torch.load(run.run_dir / f"global_step_{checkpoint}" / "data.pt", weights_only=False)
    sampler = next(v for _, v in _walk(state) if isinstance(v, dict) and "plan" in v and "num_rows" in v)
    plan = sampler["plan"]
    order, position = np.asarray(plan["order"]), int(plan["position"])
    assert position == 2 * BATCH  # two of epoch 1's six steps were trained before the checkpoint
    traces = run.traces()
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


def test_the_online_draft_head_is_saved_and_resumed(multi_turn_resume_run):
    """ROLLOUT_SPECULATIVE=eagle3 with ROLLOUT_DRAFT_ONLINE=1 (conftest.py MT_RESUME): each checkpoint holds the head
    as trained to its step (a head directory vLLM loads, and its optimizer), and the relaunch takes it back: its
    first step goes on from the saved optimizer-step count, as the killed launch's did, and the engines' heads were
    checked equal to it (the run stops otherwise: recipe/adapter/draft_learning.py)."""
    import json
    import re

    from safetensors.numpy import load_file

    from recipe.drafting.head_trainer import STATE, WEIGHTS

    run, killed = multi_turn_resume_run, multi_turn_resume_run.killed
    saved = run.run_dir / f"global_step_{killed.checkpoint}" / "draft_head"
    per_step = 8  # ROLLOUT_DRAFT_TRAIN_STEPS' default
    assert json.loads((saved / STATE).read_text())["optimizer_steps"] == per_step * killed.checkpoint
    assert f"draft head resumed from {saved} ({per_step * killed.checkpoint} optimizer steps)" in run.output
    assert "draft head resumed" not in killed.output
    first, second = (_metrics_by_step(p) for p in sorted((run.run_dir / "logs").glob("metrics.*.jsonl")))
    step = killed.checkpoint + 1
    assert first[step]["draft_head/optimizer_steps"] == second[step]["draft_head/optimizer_steps"] == per_step * step
    start = re.search(r"LlamaForCausalLMEagle3 at (\S+),", killed.output).group(1)  # the preflight's note
    head, initial = load_file(saved / WEIGHTS), load_file(f"{start}/{WEIGHTS}")
    assert sorted(head) == sorted(initial) and any(not np.array_equal(head[k], initial[k]) for k in initial)
    tops = [m["draft_head/top1_before_train"] for _, m in sorted({**first, **second}.items())]
    print(f"online head, first-draft top-1 on each step's rollouts: {[round(t, 3) for t in tops]}")


def _metrics_by_step(path) -> dict[int, dict]:
    import json

    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.setdefault(int(rec["step"]), {}).update(rec["data"])
    return {s: m for s, m in out.items() if "draft_head/optimizer_steps" in m}
