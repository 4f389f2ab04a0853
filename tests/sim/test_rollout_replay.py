"""The real-engine replay's cheap parts: CLI, the dry mode (engine model behind the same executor interface), the
results section, the scaling helpers, and the shell wrapper. The replay on vLLM itself is a benchmark, not a test."""
import asyncio
import dataclasses
import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recipe.sim import trace as T
from recipe.sim.policies import ONPOLICY_CAP, POLICIES
from harness.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _load_replay():
    return load_script(ROOT / "bench" / "rollout_replay.py")


def test_help_and_dry_run_pipeline(tmp_path):
    help_ = subprocess.run([sys.executable, "bench/rollout_replay.py", "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert help_.returncode == 0 and "--dry-run" in help_.stdout and "--repeats" in help_.stdout
    out = tmp_path / "r.json"
    results = tmp_path / "RESULTS.md"
    results.write_text("# R\n\nbefore\n\n<!-- rollout_replay:start -->\nold\n<!-- rollout_replay:end -->\n\nafter\n")
    code = """if True:
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("rr", "bench/rollout_replay.py")
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        rc = mod.main(sys.argv[1:])
        assert "vllm" not in sys.modules, "the dry run must not import vLLM"
        sys.exit(rc)
    """
    run = subprocess.run([sys.executable, "-c", code, "--dry-run", "--prompts", "16", "--n", "2", "--batch-size",
                          "4", "--epochs", "2", "--repeats", "2", "--kv-repeats", "1", "--kv-blocks", "4",
                          "--max-len", "128", "--json", str(out), "--results", str(results)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rep = json.loads(out.read_text())
    assert set(rep["policies"]) == {"baseline", "seed", "best", "best-onpolicy"}
    # the dry run measures the model it then fits on baseline steps only: the held-out fit recovers a, b and the
    # prediction equals the measurement for every other policy
    assert rep["fit_heldout"]["steps"] == 2 * 2 * 4 and rep["r2"]["heldout_on_all"] > 0.999
    assert rep["goal_met"] and rep["worst_rel_diff_heldout"] < 1e-3
    for p in rep["policies"].values():
        assert p["every_prompt_once_per_epoch"] and len(p["measured_speedup"]) == 2
        assert abs(p["predicted[held out: baseline steps]"] - p["measured_mean"]) < 2e-3
    assert rep["policies"]["best"]["max_policy_versions"] <= POLICIES["best"].max_resumes + 1
    assert rep["trace"]["response_length"] == 128 and len(rep["steps"]) == 2 * 4 * 2 * 4
    kv = rep["kv"]  # 4 blocks of 128 tokens for requests of up to 48 + 128: queueing and preemption, modelled
    assert set(kv["policies"]) == {"baseline", "best-onpolicy-fcfs", "best-onpolicy"} and kv["block_size"] == 128
    assert kv["baseline_time_s"] > rep["policies"]["baseline"]["measured_warm_time_s"][0]
    assert sum(s["preemptions"] for s in kv["steps"]) > 0 and kv["worst_rel_diff_heldout"] < 1e-3
    text = results.read_text()
    assert text.startswith("# R\n\nbefore") and text.rstrip().endswith("after") and "old" not in text
    assert "| best |" in text and text.count("<!-- rollout_replay:start -->") == 1 and "KV run" in text
    assert "measured speedup" in run.stdout and "Reproduce:" in run.stdout
    assert "[main run, repeat 1/2" in run.stderr and "epoch 1 step" in run.stderr  # progress as it goes


def test_interleaving_rotates_and_gives_every_policy_all_its_steps():
    mod = _load_replay()
    trace = T.generate("reference", num_prompts=16, n=2, epochs=2).scaled(64)

    class Spy:
        def __init__(self, name, log, inner):
            self.name, self.log, self.inner = name, log, inner

        def run_step(self, policy, plan, launch, **kw):
            self.log.append(self.name)
            return self.inner.run_step(policy, plan, launch, **kw)

    from recipe.sim.engine import EngineParams
    from recipe.sim.run import ModelExecutor

    log: list[str] = []
    names = ["baseline", "seed", "best"]
    ex = {nm: Spy(nm, log, ModelExecutor(EngineParams(replicas=1, max_num_seqs=64))) for nm in names}
    runs = mod.interleaved(trace, names, ex, batch_size=4, seed=0, rotate=1)
    assert all(len(r.steps) == 8 for r in runs.values())
    assert log[:6] == ["seed", "best", "baseline", "best", "baseline", "seed"]


def test_trace_and_policy_scaling():
    tr = T.generate("reference", num_prompts=64, n=4, epochs=2)
    sc = tr.scaled(256)
    assert sc.response_length == 256 and sc.lengths.max() <= 256 and sc.lengths.min() >= 1
    assert np.array_equal(sc.truncated, tr.truncated)
    assert np.allclose(sc.lengths[~tr.truncated], np.clip(np.rint(tr.lengths[~tr.truncated] / 64), 1, 256))
    retry = sc.attempt_lengths(1, np.arange(8), np.ones(8, np.int64))  # fresh draws stay on the scaled levels
    assert retry.max() <= 256 and 0.5 < retry.mean() / sc.lengths[1, :8].mean() < 2
    with pytest.raises(ValueError):
        tr.scaled(20000)
    seed = POLICIES["seed"].scaled(1 / 64)
    assert seed.cap_kwargs == {"min_tokens": 156, "factor": 2.0} and seed.bucket_size == 16
    cal = POLICIES["calibrated"].scaled(1 / 64)
    assert cal.cap_kwargs == {"align": 8, "min_tokens": 64, "quantile": 0.75}
    budget = POLICIES["best-onpolicy"].scaled(1 / 64)
    assert budget.cap_kwargs == {"align": 4, "min_tokens": 16, **ONPOLICY_CAP}
    best = POLICIES["best"].scaled(1 / 64)
    assert (best.oversample_ratio, best.oversample_requeue, best.max_resumes, best.cap) == (
        POLICIES["best"].oversample_ratio, "continue", POLICIES["best"].max_resumes, "none")
    on = POLICIES["tailcut-level"]  # the tail cut counts responses, not tokens: it does not scale
    assert (on.scaled(1 / 64).tail_cut, on.scaled(1 / 64).tail_cut_exponent) == (on.tail_cut, on.tail_cut_exponent)


def test_shell_wrapper():
    script = ROOT / "scripts" / "bench_rollout.sh"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    out = subprocess.run(["bash", str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "BENCH_SKIP_BOOTSTRAP": "1", "HOME": str(Path.home())})
    assert out.returncode == 0, out.stderr
    assert "--dry-run" in out.stdout and "--results" not in out.stderr  # --help: nothing is written


class _FakeEngine:
    """Just enough of ``InProcessVLLM`` for ``VLLMExecutor``: one token per tick for every running request, the
    final output only, ``abort_all`` ends the running streams with their tokens so far (vLLM's behaviour)."""

    class _Core:
        def __init__(self, outer):
            self.outer = outer

        async def reset_prefix_cache(self):
            pass

        async def generate(self, prompt, params, request_id, priority=0):
            from types import SimpleNamespace
            tokens, reason = [], "length"
            self.outer.running += 1
            try:
                while len(tokens) < params.max_tokens:
                    if self.outer.aborted:
                        reason = "abort"
                        break
                    await asyncio.sleep(0.0005)
                    tokens.append(7)
            finally:
                self.outer.running -= 1
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, finish_reason=reason)])

    def __init__(self):
        from types import SimpleNamespace
        self.engine, self.preemptions = self._Core(self), SimpleNamespace(count=0)
        self.running, self.aborted = 0, False

    def run(self, coro, timeout=None):
        self.aborted = False
        return asyncio.run(coro)

    async def abort_all(self):
        self.aborted = True
        return []

    async def wait_until_idle(self, timeout=10.0):
        while self.running:
            await asyncio.sleep(0.001)
        return {}


def test_real_engine_executor_applies_the_tail_cut(monkeypatch, tmp_path):
    """The replay aborts a tail-cut step where the trainer would (``TailCut.should_cut`` on the finished count) and
    the aborted responses keep their tokens and are trained as truncated; vLLM itself is faked."""
    from types import ModuleType, SimpleNamespace

    from recipe.core.tailcut import TailCut
    from recipe.sim.policies import register
    from recipe.sim.run import iter_policy

    fake = ModuleType("vllm")
    fake.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs, sp = ModuleType("vllm.inputs"), ModuleType("vllm.sampling_params")
    inputs.TokensPrompt = lambda **kw: kw
    sp.RequestOutputKind = SimpleNamespace(FINAL_ONLY=2)
    for name, mod in (("vllm", fake), ("vllm.inputs", inputs), ("vllm.sampling_params", sp)):
        monkeypatch.setitem(sys.modules, name, mod)
    replay = _load_replay()  # vLLM is imported by the executor's step only, so the fake above is what it finds
    trace = T.generate("reference", num_prompts=16, n=4, epochs=2).scaled(64)
    register(dataclasses.replace(POLICIES["tailcut"], name="test-replay-tailcut", tail_cut=0.75).scaled(64 / 16384))
    try:
        ex = replay.VLLMExecutor(_FakeEngine(), [[1, 2, 3]] * 16, n=4)
        steps = list(iter_policy(trace, "test-replay-tailcut", ex, batch_size=4, previous=trace.previous_run(),
                                 record_path=tmp_path / "cut.jsonl"))
    finally:
        del POLICIES["test-replay-tailcut"]
    recs = [json.loads(line) for line in (tmp_path / "cut.jsonl").read_text().splitlines()]
    aborted = [sum(f == "abort" for f in r["finish"]) for r in recs]
    allowed = 16 - TailCut(0.75).finished_needed(16)
    assert len(steps) == len(recs) == 8 and sum(aborted) > 0
    for s, a in zip(steps, aborted):
        assert s.responses == 16 and a <= allowed and s.truncated >= a  # stopped responses count as truncated
