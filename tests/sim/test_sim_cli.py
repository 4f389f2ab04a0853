"""The CLI contract: ``--json`` prints exactly one JSON object of the documented shape."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipe.sim", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_default_json_is_the_reference_run():
    out = sim("--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)  # exactly one object: json.loads rejects trailing data
    assert set(report) >= {"trace", "engine", "policies", "goals"}
    tr = report["trace"]
    assert (tr["name"], tr["num_prompts"], tr["n"], tr["response_length"]) == ("reference", 1024, 16, 16384)
    assert tr["epochs"] >= 3 and report["batch_size"] == 32
    assert {"decode_a", "decode_b", "replicas", "max_num_seqs"} <= set(report["engine"])
    names = [p["name"] for p in report["policies"]]
    assert {"baseline", "seed", "best"} <= set(names)
    for p in report["policies"]:
        assert {"name", "epoch_times_s", "speedup_vs_baseline", "truncated_fraction", "prompts_trained_per_epoch",
                "step_time_p50_s", "step_time_p95_s", "step_time_max_s", "tokens_per_s", "lower_bound_s"} <= set(p)
        assert len(p["epoch_times_s"]) == tr["epochs"] and p["prompts_trained_per_epoch"] == [1024] * tr["epochs"]
    assert report["policies"][0]["speedup_vs_baseline"] == 1.0
    assert {"best_minus_seed_speedup", "moonshot"} <= set(report["goals"])
    by = {p["name"]: p for p in report["policies"]}
    for p in report["policies"]:  # staleness of every policy: none for the on-policy ones
        assert {"stale_token_fraction", "resumed_response_fraction", "max_policy_versions"} <= set(p)
    assert by["seed"]["max_policy_versions"] == 1 and by["seed"]["stale_token_fraction"] == 0
    best = by["best"]
    assert best["spec"]["oversample_requeue"] == "continue"
    assert best["max_policy_versions"] <= best["spec"]["max_resumes"] + 1
    assert 0 < best["stale_token_fraction"] < 1 and report["goals"]["best_max_policy_versions"] == 2


def test_options_record_and_replay(tmp_path):
    out = sim("--json", "--trace", "bimodal", "--prompts", "96", "--n", "4", "--epochs", "2", "--batch-size", "16",
              "--policies", "seed,oversample-restart", "--replicas", "2", "--decode-a", "0.02",
              "--record", str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["engine"]["replicas"] == 2 and report["engine"]["decode_a"] == 0.02
    assert [p["name"] for p in report["policies"]] == ["baseline", "seed", "oversample-restart"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["baseline.jsonl", "oversample-restart.jsonl", "seed.jsonl"]
    replay = sim("--json", "--trace", str(tmp_path / "baseline.jsonl"), "--batch-size", "16", "--fit-engine",
                 "--policies", "best")
    assert replay.returncode == 0, replay.stderr
    again = json.loads(replay.stdout)
    assert again["trace"]["num_prompts"] == 96 and again["engine"]["fit"]["steps"] == 12
    table = sim("--trace", "heavy_tail", "--prompts", "64", "--epochs", "2", "--trace-param", "within_sigma=0.3")
    assert table.returncode == 0 and table.stdout.count("\n| ") >= 3 and "moonshot" in table.stdout
    bad = sim("--policies", "nope")
    assert bad.returncode != 0 and "unknown policies" in bad.stderr
