"""The CLI contract: ``--json`` prints exactly one JSON object of the documented shape."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recipe.sim.engine import KV_TOKENS

ROOT = Path(__file__).resolve().parents[2]


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipe.sim", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def by_name(report: dict) -> dict:
    return {p["name"]: p for p in report["policies"]}


def test_default_json_is_the_reference_run():
    out = sim("--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)  # exactly one object: json.loads rejects trailing data
    assert set(report) >= {"trace", "engine", "policies", "goals"}
    tr = report["trace"]
    assert (tr["name"], tr["num_prompts"], tr["n"], tr["response_length"]) == ("reference", 1024, 16, 16384)
    assert tr["epochs"] >= 3 and report["batch_size"] == 32
    assert {"decode_a", "decode_b", "replicas", "max_num_seqs", "kv_tokens", "block_size"} <= set(report["engine"])
    assert report["engine"]["kv_tokens"] == KV_TOKENS["h100"]
    names = [p["name"] for p in report["policies"]]
    assert names == ["baseline", "seed", "best-onpolicy", "tailcut-budget", "best-onpolicy-spec", "best", "oracle"]
    spec = report["speculation"]  # the acceptance length best-onpolicy-spec assumes, and the roofline's inputs
    assert spec["acceptance_length"] == spec["tau"] == 2.04 and {"k", "rho", "t0", "bandwidth", "tp"} <= set(spec)
    assert "AngelSlim" in spec["acceptance_length_source"] and "published" in spec["acceptance_length_source"]
    g = report["goals"]["onpolicy_spec"]
    assert g["target_speedup"] == 3.0 and g["at_least_3x"] == (g["speedup"] >= 3.0)
    assert g["strictly_on_policy"] and g["met"] == all(v for k, v in g.items() if isinstance(v, bool) and k != "met")
    assert by_name(report)["best-onpolicy-spec"]["spec"]["speculate"] == "always"
    assert by_name(report)["best-onpolicy-spec"]["max_policy_versions"] == 1
    for p in report["policies"]:
        assert {"name", "epoch_times_s", "speedup_vs_baseline", "truncated_fraction", "stale_token_fraction",
                "epoch0_speedup_vs_baseline", "preemptions_per_request", "prediction_rank_corr_per_epoch",
                "prompts_trained_per_epoch", "step_time_p50_s", "tokens_per_s", "lower_bound_s"} <= set(p)
        assert len(p["epoch_times_s"]) == tr["epochs"] and p["prompts_trained_per_epoch"] == [1024] * tr["epochs"]
    assert report["policies"][0]["speedup_vs_baseline"] == 1.0
    by = {p["name"]: p for p in report["policies"]}
    assert by["seed"]["max_policy_versions"] == 1 and by["seed"]["stale_token_fraction"] == 0
    on = by["best-onpolicy"]  # strictly on-policy, warm-started from an earlier run, faster in epoch 0
    assert on["max_policy_versions"] == 1 and on["stale_token_fraction"] == 0 and on["warm_started_rows"] == 1024
    assert on["epoch0_speedup_vs_baseline"] >= 1.1 and by["seed"]["epoch0_speedup_vs_baseline"] == 1.0
    best = by["best"]
    assert best["spec"]["oversample_requeue"] == "continue"
    assert best["max_policy_versions"] <= best["spec"]["max_resumes"] + 1 and 0 < best["stale_token_fraction"] < 1
    goals = report["goals"]
    assert {"best_minus_seed_speedup", "moonshot", "onpolicy"} <= set(goals)
    o = goals["onpolicy"]
    assert o["strictly_on_policy"] and o["warm_started"] and o["epoch0_at_least_1.1x"]
    assert o["met"] == all(v for k, v in o.items() if isinstance(v, bool) and k != "met")
    assert goals["moonshot"]["closest_onpolicy_policy"] and "onpolicy_gap" in goals["moonshot"]


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
    cold = sim("--trace", str(tmp_path / "baseline.jsonl"), "--batch-size", "16", "--policies", "best-onpolicy")
    assert cold.returncode != 0 and "--warm-start-from" in cold.stderr  # a recording has no previous_run()
    warm = sim("--json", "--trace", str(tmp_path / "seed.jsonl"), "--batch-size", "16", "--policies",
               "best-onpolicy", "--warm-start-from", str(tmp_path / "baseline.jsonl"))
    assert warm.returncode == 0, warm.stderr
    assert {p["name"]: p for p in json.loads(warm.stdout)["policies"]}["best-onpolicy"]["warm_started_rows"] == 96


def test_kv_capacity_options(capsys):
    from recipe.sim.__main__ import main

    def run(*extra):
        assert main(["--json", "--prompts", "64", "--n", "4", "--epochs", "2", "--batch-size", "16", "--policies",
                     "seed", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    assert run("--gpu", "h200")["engine"]["kv_tokens"] == KV_TOKENS["h200"]
    small, free = run("--kv-tokens", "40000"), run("--kv-tokens", "0")
    assert small["engine"]["kv_tokens"] == 40000 and free["engine"]["kv_tokens"] is None
    by = lambda r: {p["name"]: p for p in r["policies"]}  # noqa: E731
    assert by(small)["baseline"]["preemptions_per_request"] > 0 == by(free)["baseline"]["preemptions_per_request"]
    assert by(small)["baseline"]["rollout_time_s"] > by(free)["baseline"]["rollout_time_s"]
    with pytest.raises(SystemExit, match="kv_tokens"):
        run("--kv-tokens", "8")


def test_a_measured_acceptance_curve_replaces_the_published_figure(tmp_path, capsys):
    """``--acceptance-curve`` + ``--drafter``: the speculating policy runs on the estimator's measured tokens per step
    (a report from ``python -m recipe.sim.acceptance --json``), and the report says where the figure comes from;
    a corpus drafter's CPU cost per emitted token slows it."""
    from recipe.sim.__main__ import main
    from recipe.sim.acceptance import Group, estimate

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50, 8)
    text = rng.integers(0, 50, 64)
    groups = [Group("p", prompt, tuple(np.concatenate([text[:40 + i], rng.integers(0, 50, 4)]) for i in range(4)))]
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"drafters": estimate(groups, ["suffix:own+group"], boot=50)}))
    name = "suffix:own+group:k=4:depth=24:min=1"

    def run(*extra):
        assert main(["--json", "--prompts", "64", "--n", "4", "--epochs", "2", "--batch-size", "16", "--policies",
                     "best-onpolicy-spec", "--acceptance-curve", str(path), "--drafter", name, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    free, costly = run("--spec-draft-s-per-context-token", "0"), run("--spec-draft-s-per-context-token", "0",
                                                                      "--spec-draft-s-per-new-token", "1e-3")
    assert free["speculation"]["draft_s_per_token"] == 0
    assert free["speculation"]["acceptance_length_source"] == f"{path}: {name}"
    assert free["speculation"]["acceptance_length"] is None and free["speculation"]["curve"]["tau"]
    assert costly["speculation"]["draft_s_per_new_token"] == 1e-3
    # a drafter from the group: routed by group (affinity's imbalance) with 0..K drafts (PIECEWISE graphs)
    assert free["speculation"]["group_affinity"] is True and free["speculation"]["ragged_drafts"] is True
    speed = [by_name(r)["best-onpolicy-spec"]["speedup_vs_baseline"] for r in (free, costly)]
    assert speed[1] < speed[0], speed
    # the table's summary line names the curve it ran on and today's goal (issue 44: 3x), not an assumed length
    path.write_text(json.dumps({"source": "four noisy copies", "drafters": json.loads(path.read_text())["drafters"]}))
    assert main(["--prompts", "64", "--n", "4", "--epochs", "2", "--batch-size", "16", "--policies",
                 "best-onpolicy-spec", "--acceptance-curve", str(path), "--drafter", name]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("- best-onpolicy-spec"))
    assert f"from {path}: {name} (four noisy copies)" in line and "tokens per step" in line, line
    assert "goal (>= 3x" in line and "assumed" not in line and "2.04" not in line, line
    lone = sim("--acceptance-curve", str(path))
    assert lone.returncode != 0 and "--acceptance-curve and --drafter go together" in lone.stderr
    wrong = sim("--acceptance-curve", str(path), "--drafter", "ngram")
    assert wrong.returncode != 0 and "'ngram' is not in the acceptance report" in wrong.stderr
