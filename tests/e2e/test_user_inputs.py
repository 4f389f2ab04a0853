"""A user's own parquet (plain-text prompts and answers under their own column names), reward function and logger
choice through verl's real loop on the CPU (the weight-sync control run carries them: tests/e2e/conftest.py
``_user_inputs``)."""
import json
import re


def test_users_data_reward_and_logger_run_through_verls_loop(restart_without_sync_run):
    run = restart_without_sync_run
    metrics = run.metrics()
    assert metrics, "no training step"
    # the user's function scored every response (0.5 + half the digit share; the preset's own reward is below 0.5)
    assert all(0.5 <= m["critic/score/min"] <= m["critic/score/max"] <= 1.0 for m in metrics.values()), metrics
    # the rows' data_source is the one the dataset fills in for a file without it, and validation ran on it
    records = [json.loads(line) for path in (run.run_dir / "logs").glob("metrics.*.jsonl")
               for line in path.read_text().splitlines() if line.strip()]
    val = [v for r in records for k, v in r["data"].items() if k.startswith("val-core/user/")]
    assert val and all(0.5 <= v <= 1.0 for v in val), sorted({k for r in records for k in r["data"]})[:40]
    # LOGGER=console: verl's console logger printed every step, and nothing went to wandb
    printed = {int(s) for s in re.findall(r"step:(\d+) - .*critic/score/mean:", run.output)}
    assert set(metrics) <= printed, sorted(printed)
    assert not (run.run_dir / "wandb").exists()
