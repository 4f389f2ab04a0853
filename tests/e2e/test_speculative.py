"""Speculative decoding (``ROLLOUT_SPECULATIVE=ngram``) through verl's real loop on the CPU, in the control run
(conftest.py ``restart_without_sync_run``: the preflight's composed config, verl's vLLM server, the recipe's
trainer): the run ends, and every step logs the acceptance the recipe reads from vLLM's counters
(recipe/adapter/spec_metrics.py), in its metrics and in its length trace."""
import json

from recipe.adapter.spec_metrics import PREFIX, VAL_PREFIX as VAL

OVER_SAMPLE_STEPS = 8  # tests/e2e/conftest.py: the control run's length

def logged(run) -> dict[int, dict]:
    """verl's file logger by step, the validation before training (step 0) included (``Run.metrics`` leaves it out)."""
    by_step: dict[int, dict] = {}
    for path in sorted((run.run_dir / "logs").glob("metrics.*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                by_step.setdefault(int(rec["step"]), {}).update(rec["data"])
    return by_step


NAMES = ("drafts", "draft_tokens", "accepted_tokens", "draft_acceptance_rate", "acceptance_length")


def test_ngram_acceptance_is_logged_every_step(restart_without_sync_run):
    metrics, traces = restart_without_sync_run.metrics(), restart_without_sync_run.traces()
    assert sorted(metrics) == list(range(1, OVER_SAMPLE_STEPS + 1)), "the run ends after its last step"
    for step, m in metrics.items():
        assert all(PREFIX + n in m for n in NAMES), (step, sorted(k for k in m if k.startswith(PREFIX)))
        assert m[PREFIX + "drafts"] > 0 and m[PREFIX + "draft_tokens"] >= m[PREFIX + "drafts"], (step, m)
        assert 0 <= m[PREFIX + "accepted_tokens"] <= m[PREFIX + "draft_tokens"]
        spec = traces[step]["spec"]
        assert spec["drafts"] == m[PREFIX + "drafts"] and spec["accepted_tokens"] == m[PREFIX + "accepted_tokens"]
    accepted = sum(m[PREFIX + "accepted_tokens"] for m in metrics.values())
    drafted = sum(m[PREFIX + "draft_tokens"] for m in metrics.values())
    drafts = sum(m[PREFIX + "drafts"] for m in metrics.values())
    print(f"ngram, training rollouts, {len(metrics)} steps: {drafts:.0f} drafts, {drafted:.0f} draft tokens, "
          f"{accepted:.0f} accepted ({accepted / drafted:.1%}), acceptance length {1 + accepted / drafts:.3f}")
    # validation (verl's greedy val_kwargs): before training (step 0, logged in its own record) and at test_freq
    val = {s: m for s, m in logged(restart_without_sync_run).items() if VAL + "drafts" in m}
    assert 0 in val and len(val) >= 2, sorted(val)
    for step, m in val.items():
        print(f"ngram, validation at step {step}: {m[VAL + 'drafts']:.0f} drafts, {m[VAL + 'draft_tokens']:.0f} "
              f"draft tokens, {m[VAL + 'accepted_tokens']:.0f} accepted, acceptance length "
              f"{m[VAL + 'acceptance_length']:.3f}")
    assert sum(m[VAL + "accepted_tokens"] for m in val.values()) > 0, "greedy validation accepts drafts"
    assert all(m[VAL + "acceptance_length"] > 1 for m in val.values() if m[VAL + "accepted_tokens"] > 0)
