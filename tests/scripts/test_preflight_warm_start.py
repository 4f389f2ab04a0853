"""The warm-start sources and the priority path, checked by the preflight before anything starts."""
import json

from recipe.preflight import run_preflight
from recipe.traces import LengthTraceWriter


def write_traces(path, with_keys=True):
    with LengthTraceWriter(path) as w:
        w.append(epoch=0, step=1, cap=None, response_length=64, gen_time_s=1.0, rows=[0, 0], sample_index=[0, 1],
                 lengths=[10, 12], prompt_keys=["k0", "k0"] if with_keys else None)
    return path


def test_init_from_that_is_missing_or_unmatchable_is_named(env_tiny, tmp_path):
    errors = run_preflight(env={**env_tiny, "SAMPLER_INIT_FROM": str(tmp_path / "nope")}).errors
    assert any("SAMPLER_INIT_FROM" in e and "no length traces there" in e for e in errors), errors
    old = write_traces(tmp_path / "old.jsonl", with_keys=False)
    errors = run_preflight(env={**env_tiny, "SAMPLER_INIT_FROM": str(old)}).errors
    assert any("carry no prompt keys" in e for e in errors), errors


def test_init_from_a_run_directory_composes_with_a_note(env_tiny, tmp_path):
    run = tmp_path / "run"
    write_traces(run / "length_traces.jsonl")
    report = run_preflight(env={**env_tiny, "SAMPLER_INIT_FROM": str(run)})
    assert report.ok, report.errors
    assert report.config.data.sampler.init_from == str(run)
    assert any("warm start from" in n for n in report.notes)
    assert report.config.trainer.experiment_name.endswith("-warm")


def test_prior_column_must_be_in_the_train_file(env_tiny):
    errors = run_preflight(env={**env_tiny, "SAMPLER_PRIOR_COLUMN": "expected_len"}).errors
    assert any("SAMPLER_PRIOR_COLUMN='expected_len' is not a column of TRAIN_FILE" in e for e in errors), errors


def test_priority_scheduling_composes_and_refuses_verls_full_determinism(env_tiny):
    report = run_preflight(env={**env_tiny, "ROLLOUT_SCHEDULING_POLICY": "priority"})
    assert report.ok and report.config.actor_rollout_ref.rollout.scheduling_policy == "priority"
    errors = run_preflight(["actor_rollout_ref.rollout.full_determinism=True"],
                           env={**env_tiny, "ROLLOUT_SCHEDULING_POLICY": "priority"}).errors
    assert any("full_determinism" in e and "ROLLOUT_SAMPLING_SEED" in e for e in errors), errors


def test_budget_cap_mode(env_tiny):
    report = run_preflight(env={**env_tiny, "VLLM_ROLLOUT_EARLY_STOP_MODE": "budget",
                                "VLLM_ROLLOUT_EARLY_STOP_BUDGET": "0.01"})
    assert report.ok, report.errors
    assert report.config.recipe.cap.mode == "budget" and report.config.recipe.cap.budget.budget == 0.01
    assert report.config.trainer.experiment_name.endswith("-budgetcap")
    assert json.loads(json.dumps(report.values))["VLLM_ROLLOUT_EARLY_STOP_BUDGET"] == 0.01
