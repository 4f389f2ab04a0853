"""Speculative decoding with the recipe's group drafter (``ROLLOUT_SPECULATIVE=group``, recipe/drafting: vLLM's
``custom_class`` proposer, loaded by verl's vLLM server from the composed config) through verl's real loop on the CPU,
in the main command's run (conftest.py ``resampler_run``: the preflight's composed config, verl's vLLM server, the
recipe's trainer): the run ends, and every step logs the acceptance the recipe reads from vLLM's counters
(recipe/adapter/spec_metrics.py), in its metrics and in its length trace."""
import json

from recipe.adapter.spec_metrics import PREFIX, VAL_PREFIX as VAL
from recipe.cpu.preset import CPU_VALUES, N_TRAIN

BATCH, N = int(CPU_VALUES["TRAIN_BATCH_SIZE"]), int(CPU_VALUES["ROLLOUT_N"])
STEPS = int(CPU_VALUES["TOTAL_EPOCHS"]) * N_TRAIN // BATCH


def logged(run) -> dict[int, dict]:
    """verl's file logger by step, the validation before training (step 0) included (``Run.metrics`` leaves it out)."""
    by_step: dict[int, dict] = {}
    for path in sorted((run.run_dir / "logs").glob("metrics.*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                by_step.setdefault(int(rec["step"]), {}).update(rec["data"])
    return by_step


NAMES = ("drafts", "draft_tokens", "accepted_tokens", "generation_tokens", "draft_acceptance_rate", "acceptance_length",
         "tokens_per_step")


def test_group_drafter_acceptance_is_logged_every_step(resampler_run):
    metrics, traces = resampler_run.metrics(), resampler_run.traces()
    assert sorted(metrics) == list(range(1, STEPS + 1)), "the run ends after its last step"
    for step, m in metrics.items():
        assert all(PREFIX + n in m for n in NAMES), (step, sorted(k for k in m if k.startswith(PREFIX)))
        assert m[PREFIX + "drafts"] > 0 and m[PREFIX + "draft_tokens"] >= m[PREFIX + "drafts"], (step, m)
        assert 0 <= m[PREFIX + "accepted_tokens"] <= m[PREFIX + "draft_tokens"]
        # every response's tokens were generated in this step (nothing is carried over), at most one
        # verify step per token: generated - accepted steps, each emitting one token plus its accepted drafts
        assert m[PREFIX + "generation_tokens"] >= sum(traces[step]["lengths"]) > 0, step
        assert m[PREFIX + "tokens_per_step"] == m[PREFIX + "generation_tokens"] / (
            m[PREFIX + "generation_tokens"] - m[PREFIX + "accepted_tokens"])
        spec = traces[step]["spec"]
        assert spec["drafts"] == m[PREFIX + "drafts"] and spec["accepted_tokens"] == m[PREFIX + "accepted_tokens"]
        assert spec["tokens_per_step"] == m[PREFIX + "tokens_per_step"]
    accepted = sum(m[PREFIX + "accepted_tokens"] for m in metrics.values())
    drafted = sum(m[PREFIX + "draft_tokens"] for m in metrics.values())
    drafts = sum(m[PREFIX + "drafts"] for m in metrics.values())
    generated = sum(m[PREFIX + "generation_tokens"] for m in metrics.values())
    print(f"group drafter, training rollouts, {len(metrics)} steps: {drafts:.0f} drafts, {drafted:.0f} draft tokens, "
          f"{accepted:.0f} accepted ({accepted / drafted:.1%}), acceptance length {1 + accepted / drafts:.3f}, "
          f"{generated / (generated - accepted):.3f} tokens per step over all steps")
    # validation (verl's greedy val_kwargs): before training (step 0, logged in its own record) and at test_freq
    val = {s: m for s, m in logged(resampler_run).items() if VAL + "drafts" in m}
    assert 0 in val and len(val) >= 2, sorted(val)
    for step, m in val.items():
        print(f"group drafter, validation at step {step}: {m[VAL + 'drafts']:.0f} drafts, "
              f"{m[VAL + 'draft_tokens']:.0f} draft tokens, {m[VAL + 'accepted_tokens']:.0f} accepted, "
              f"acceptance length {m[VAL + 'acceptance_length']:.3f}, {m[VAL + 'tokens_per_step']:.3f} tokens per step")
    assert sum(m[VAL + "accepted_tokens"] for m in val.values()) > 0, "greedy validation accepts drafts"
    assert all(m[VAL + "acceptance_length"] > 1 for m in val.values() if m[VAL + "accepted_tokens"] > 0)


def test_recorded_tokens_are_every_trained_response_and_the_estimator_reads_them(resampler_run):
    """``RECORD_TOKENS=1``: one file per step, each trained response's ids under its row (responses in sample order,
    their lengths the trace's), and ``python -m recipe.sim.acceptance`` estimates drafters on the directory."""
    import subprocess
    import sys

    from recipe.sim.acceptance import load_groups
    from harness.cpu_runs import REPO
    from recipe.token_record import step_files

    run, traces = resampler_run, resampler_run.traces()
    tokens = run.run_dir / "tokens"
    assert [int(p.name[5:11]) for p in step_files(tokens)] == sorted(traces)
    groups = load_groups(tokens)
    for step, rec in traces.items():
        kept = list(zip(rec["rows"], rec["sample_index"], rec["lengths"]))
        recorded = {(int(g.prompt_id), i, len(resp)) for g in groups if g.epoch == rec["epoch"]
                    for i, resp in enumerate(g.responses)}
        assert len(kept) == BATCH * N and set(kept) <= recorded, step
    out = subprocess.run([sys.executable, "-m", "recipe.sim.acceptance", str(tokens)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ngram" in out.stdout, out.stderr[-2000:]
    print(out.stdout)
