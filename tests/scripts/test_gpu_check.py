"""``scripts/gpu_check.sh`` and ``recipe/gpu_check.py`` on a CPU: arguments, ``--dry-run``, the refusal without a
GPU, the step orchestration with stand-ins for the GPU commands, and the pure parts (tolerances, weight comparison,
smoke-log check, table). The GPU commands themselves (conversion, Megatron engine, training) cannot run here.
"""
import copy
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch

from recipe import gpu_check
from recipe.gpu_check import format_table, logit_metrics, logits_verdict, read_steps, smoke_problems, weight_problems

REPO = Path(__file__).resolve().parents[2]


def dry_run_steps(stdout: str) -> dict[str, list[str]]:
    lines = stdout.split("the steps (not run)", 1)[1].splitlines()[1:]
    return {name: shlex.split(cmd) for name, cmd in (line.split(": ", 1) for line in lines if line.strip())}


# ---- the script -------------------------------------------------------------------------------------------------

def test_dry_run_prints_each_step_without_running_it(run_script, tiny_artifacts, tmp_path):
    work = tmp_path / "work"
    r = run_script("gpu_check.sh", {}, "--dry-run", "--work", str(work), gpus=0)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = dry_run_steps(r.stdout)
    assert list(steps) == ["convert", "logits", "smoke", "smoke-logs", "smoke-spec", "spec-logs"]
    model, distcp = str(tiny_artifacts.model_dir), str(work / "distcp")
    convert = steps["convert"]
    assert {f"MODEL_PATH={model}", f"DISTCP_PATH={distcp}", "CONVERT_PP=1", "CONVERT_EP=1", "CONVERT_NNODES=1",
            "GPUS_PER_NODE=1"} <= set(convert) and convert[-1] == str(REPO / "scripts" / "convert_hf_to_distcp.sh")
    assert steps["logits"][1:] == ["-m", "recipe.gpu_check", "logits", "--model", model, "--distcp", distcp]
    smoke = steps["smoke"]
    assert {"PRESET=smoke", f"DISTCP_PATH={distcp}", f"CKPT_ROOT={work / 'runs'}"} <= set(smoke)
    assert smoke[-2:] == [str(REPO / "scripts" / "train_grpo.sh"), "trainer.total_training_steps=2"]
    assert steps["smoke-logs"][-3:] == [str(work / "runs" / "smoke-grpo-resampler"), "--steps", "2"]
    spec = steps["smoke-spec"]  # the smoke step again, speculating
    assert {"PRESET=smoke", f"DISTCP_PATH={distcp}", f"CKPT_ROOT={work / 'runs'}", "EXPERIMENT_NAME=smoke-grpo-spec",
            "ROLLOUT_SPECULATIVE=group"} <= set(spec)
    assert spec[-2:] == [str(REPO / "scripts" / "train_grpo.sh"), "trainer.total_training_steps=2"]
    assert steps["spec-logs"][-4:] == [str(work / "runs" / "smoke-grpo-spec"), "--steps", "2", "--spec"]
    assert not work.exists()  # nothing written


@pytest.mark.parametrize("own_head", [False, True], ids=["tiny-head", "own-head"])
def test_dry_run_with_eagle3_speculates_with_a_head_in_place_of_the_group_drafter(run_script, tiny_artifacts,
                                                                                 tmp_path, own_head):
    """--eagle3: the speculative smoke step with vLLM's EAGLE-3 proposer, on DRAFT_MODEL_PATH's head if set, else
    on the tiny head trained for the tiny model, whose log check then also needs accepted drafts."""
    from recipe.tiny.eagle3_head import build_tiny_eagle3_head

    work, own = tmp_path / "work", tmp_path / "my-head"
    r = run_script("gpu_check.sh", {"DRAFT_MODEL_PATH": str(own)} if own_head else {}, "--dry-run", "--eagle3",
                   "--work", str(work), gpus=0, timeout=600)  # a cold cache trains the tiny head (~2 min)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = dry_run_steps(r.stdout)
    assert list(steps) == ["convert", "logits", "smoke", "smoke-logs", "smoke-eagle3", "eagle3-logs"]
    head = own if own_head else build_tiny_eagle3_head(tiny_artifacts.model_dir)
    eagle3 = steps["smoke-eagle3"]
    assert {"PRESET=smoke", f"DISTCP_PATH={work / 'distcp'}", f"CKPT_ROOT={work / 'runs'}", f"DRAFT_MODEL_PATH={head}",
            "EXPERIMENT_NAME=smoke-grpo-eagle3", "ROLLOUT_SPECULATIVE=eagle3", "ROLLOUT_DRAFT_ONLINE=1"} <= set(eagle3)
    assert not any(w.startswith("ROLLOUT_SPECULATIVE=group") for w in eagle3)
    assert eagle3[-2:] == [str(REPO / "scripts" / "train_grpo.sh"), "trainer.total_training_steps=2"]
    assert steps["eagle3-logs"][-4:] == [str(work / "runs" / "smoke-grpo-eagle3"), "--steps", "2",
                                         "--spec" if own_head else "--accepted"]


def test_refuses_without_a_gpu_and_rejects_bad_arguments(run_script, tmp_path):
    r = run_script("gpu_check.sh", {}, gpus=0)
    assert r.returncode == 2 and "no GPU is visible" in r.stderr and "--dry-run" in r.stderr
    r = run_script("gpu_check.sh", {}, "--fast", gpus=1)
    assert r.returncode == 2 and "unknown argument '--fast'" in r.stderr
    r = run_script("gpu_check.sh", {"GPU_CHECK_SMOKE_TIMEOUT_S": "10m"}, "--dry-run", gpus=0)
    assert r.returncode == 2 and "GPU_CHECK_SMOKE_TIMEOUT_S=10m must be a positive number of seconds" in r.stderr
    r = run_script("gpu_check.sh", {"GPU_CHECK_EAGLE3_TIMEOUT_S": "0"}, "--dry-run", gpus=0)
    assert r.returncode == 2 and "GPU_CHECK_EAGLE3_TIMEOUT_S=0 must be a positive number of seconds" in r.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    r = run_script("gpu_check.sh", {}, "--work", str(tmp_path / "used"), gpus=1)
    assert r.returncode == 2 and "is not an empty directory" in r.stderr


@pytest.fixture
def stand_in_python(tmp_path):
    """The real interpreter, except for the GPU commands: torchrun writes a structural dist checkpoint (status
    $CONVERT_STATUS), ``recipe.gpu_check logits`` reports a logits failure, ``recipe.main`` exits $MAIN_STATUS
    (default 0), and the preflight checks this CPU venv as a CPU stack."""
    py = tmp_path / "python"
    py.write_text(f"""#!/usr/bin/env bash
if [[ "$1 $2" == "-m recipe.preflight" ]]; then  # this is the CPU venv; the GPU stack check has its own tests
    RECIPE_STACK_TARGET=cpu exec {sys.executable} "$@"
fi
if [[ "$1 $2" == "-m recipe.main" ]]; then echo "MAIN $*"; exit "${{MAIN_STATUS:-0}}"; fi
if [[ "$1 $2 $3" == "-m recipe.gpu_check logits" ]]; then
    echo "weights PASS: 135 tensors equal; logits FAIL: mean KL 1.8e-02"; exit 1
fi
if [[ "$1 $2" == "-m torch.distributed.run" ]]; then
    while [[ $# -gt 0 && "$1" != --output_path ]]; do shift; done
    mkdir -p "$2"; echo '{{"sharded_backend": "torch_dist"}}' > "$2/metadata.json"; : > "$2/common.pt"
    : > "$2/.metadata"; exit "${{CONVERT_STATUS:-0}}"
fi
exec {sys.executable} "$@"
""")
    py.chmod(0o755)
    return py


@pytest.mark.parametrize("eagle3", [False, True], ids=["group", "eagle3"])
def test_runs_the_steps_and_prints_the_table(run_script, stand_in_python, tiny_artifacts, tmp_path, eagle3):
    """With a faked GPU: the real conversion script (stand-in torchrun), the stand-in logits check, the real
    preflight of the smoke runs (stand-in recipe.main), the real smoke-log check, the table and the exit status."""
    work = tmp_path / "work"
    r = run_script("gpu_check.sh", {"RECIPE_PYTHON": str(stand_in_python)}, *(["--eagle3"] if eagle3 else []),
                   "--work", str(work), gpus=1, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {row[0]: row for row in read_steps(work / "steps.tsv")}
    spec_step, spec_logs = ("smoke-eagle3", "eagle3-logs") if eagle3 else ("smoke-spec", "spec-logs")
    assert list(rows) == ["convert", "logits", "smoke", "smoke-logs", spec_step, spec_logs]
    assert [row[1] for row in rows.values()] == ["PASS", "FAIL", "PASS", "FAIL", "PASS", "FAIL"]
    assert rows["convert"][3].startswith("convert_hf_to_distcp.sh: done: DISTCP_PATH=")
    assert rows["logits"][3].endswith("logits FAIL: mean KL 1.8e-02")
    assert rows["smoke"][3].startswith("train_grpo.sh: finished with status 0")
    assert "no step [1, 2]" in rows["smoke-logs"][3]  # the stand-in trained nothing
    main = (work / "smoke.log").read_text()
    assert "preflight: OK" in main and "MAIN " in main and "trainer.total_training_steps=2" in main
    # the preflight composed the speculative config for the smoke preset (and, for eagle3, checked the head)
    spec = (work / f"{spec_step}.log").read_text()
    assert "preflight: OK" in spec and "no step [1, 2]" in rows[spec_logs][3]
    if eagle3:
        from recipe.tiny.eagle3_head import build_tiny_eagle3_head

        head = build_tiny_eagle3_head(tiny_artifacts.model_dir)
        assert f"speculative_config={{method:eagle3,num_speculative_tokens:4,model:'{head}'}}" in spec
        assert "smoke-grpo-eagle3" in spec
        assert rows[spec_step][3].startswith("head: the tiny one, trained for the tiny model, learning online; train_grpo.sh: finished")
    else:
        assert "speculative_config={method:custom_class" in spec and "smoke-grpo-spec" in spec
        assert rows[spec_step][3].startswith("train_grpo.sh: finished with status 0")
    assert "| logits | FAIL |" in r.stdout and r.stdout.rstrip().endswith("gpu_check: FAIL")


def test_a_failed_smoke_step_skips_the_eagle3_one(run_script, stand_in_python, tmp_path):
    work = tmp_path / "work"
    r = run_script("gpu_check.sh", {"RECIPE_PYTHON": str(stand_in_python), "MAIN_STATUS": "1"}, "--eagle3",
                   "--work", str(work), gpus=1, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    rows = read_steps(work / "steps.tsv")
    assert [(row[0], row[1]) for row in rows] == [
        ("convert", "PASS"), ("logits", "FAIL"), ("smoke", "FAIL"), ("smoke-logs", "FAIL"), ("smoke-eagle3", "SKIP"),
        ("eagle3-logs", "SKIP")]
    assert rows[-1][3] == "the smoke step failed" and not (work / "smoke-eagle3.log").exists()


@pytest.mark.parametrize("flags, spec_steps", [((), ("smoke-spec", "spec-logs")),
                                               (("--eagle3",), ("smoke-eagle3", "eagle3-logs"))],
                         ids=["group", "eagle3"])
def test_a_failed_conversion_skips_what_needs_it(run_script, stand_in_python, tmp_path, flags, spec_steps):
    work = tmp_path / "work"
    r = run_script("gpu_check.sh", {"RECIPE_PYTHON": str(stand_in_python), "CONVERT_STATUS": "1"}, *flags,
                   "--work", str(work), gpus=1, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [(row[0], row[1]) for row in read_steps(work / "steps.tsv")] == [
        ("convert", "FAIL"), ("logits", "SKIP"), ("smoke", "SKIP"), ("smoke-logs", "SKIP"), (spec_steps[0], "SKIP"),
        (spec_steps[1], "SKIP")]


# ---- tolerances, calibrated on the tiny model --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_logits(tiny_artifacts):
    """``logits(model) -> [4, 64, vocab]`` on the check's tokens, and the tiny model in fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_artifacts.model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, gpu_check.TOKENS_SHAPE, generator=torch.Generator().manual_seed(0))

    def logits(m):
        with torch.no_grad():
            return m(input_ids=ids).logits.float()

    return logits, model


def test_bf16_rounding_passes_and_broken_layers_fail(tiny_logits):
    logits, model = tiny_logits
    reference = logits(model)
    ok, detail = logits_verdict(logit_metrics(reference, logits(copy.deepcopy(model).to(torch.bfloat16))))
    assert ok, detail

    def broken(edit):
        m = copy.deepcopy(model)
        with torch.no_grad():
            edit(m)
        return logits_verdict(logit_metrics(reference, logits(m)))

    def swap_k_v(m):
        a = m.model.layers[3].self_attn
        k = a.k_proj.weight.clone()
        a.k_proj.weight.copy_(a.v_proj.weight)
        a.v_proj.weight.copy_(k)

    assert not broken(swap_k_v)[0]
    assert not broken(lambda m: m.model.layers[2].self_attn.q_norm.weight.mul_(0.5))[0]


def test_verdict_on_nan_and_on_identical_logits():
    x = torch.randn(2, 3, 11)
    assert logits_verdict(logit_metrics(x, x.clone()))[0]
    assert not logits_verdict(logit_metrics(x, torch.full_like(x, float("nan"))))[0]


def test_weight_comparison_is_exact_in_bf16_and_names_each_problem():
    ref = {"a.weight": torch.randn(4, 3), "b.weight": torch.randn(2), "c.weight": torch.randn(5)}
    exported = [(k, v.to(torch.bfloat16)) for k, v in ref.items()]
    assert weight_problems(exported, ref) == []
    swapped = [("a.weight", ref["a.weight"][[1, 0, 2, 3]].to(torch.bfloat16)),  # rows swapped
               ("b.weight", ref["b.weight"]),  # exported in fp32: equal after rounding
               ("x.weight", torch.zeros(1)), ("c.weight", torch.zeros(6))]
    problems = weight_problems(swapped, ref)
    assert problems[0].startswith("a.weight: values differ (max |diff|")
    assert problems[1:] == ["x.weight: exported but not in the HF checkpoint", "c.weight: shape (6,) != HF (5,)"]
    assert weight_problems(exported[:2], ref) == ["c.weight: in the HF checkpoint but not exported"]


# ---- smoke logs and the table --------------------------------------------------------------------------------------

def write_run(run: Path, steps: int, drop: str | None = None, spec: dict | None = None,
              val: dict | None = None) -> Path:
    """A run's logs: ``spec`` on every step, ``val`` on the validation before training (step 0)."""
    (run / "logs").mkdir(parents=True)
    data = {"rollout/response_max_tokens_cap": 64.0, "sampler/epoch": 0.0, "timing_s/gen": 1.0, "actor/pg_loss": 0.1,
            **(spec or {})}
    lines = [json.dumps({"step": 0, "data": {"val-core/score": 0.0, **(val or {})}})]
    lines += [json.dumps({"step": s, "data": {k: v for k, v in data.items() if k != drop}}) for s in range(1, steps + 1)]
    (run / "logs" / "metrics.20260101T000000Z.jsonl").write_text("\n".join(lines) + '\n{"step": 3, "da')
    (run / "length_traces.jsonl").write_text("".join(json.dumps({"step": s, "lengths": [5, 7]}) + "\n"
                                                     for s in range(1, steps + 1)))
    return run


def test_smoke_result_needs_each_step_with_an_update_and_the_recipes_metrics(tmp_path):
    assert smoke_problems(write_run(tmp_path / "ok", 2), 2) == []
    assert smoke_problems(write_run(tmp_path / "short", 1), 2) == [
        f"no step [2] in {tmp_path}/short/logs/metrics.*.jsonl",
        f"no length trace for step [2] in {tmp_path}/short/length_traces.jsonl"]
    assert smoke_problems(write_run(tmp_path / "nocap", 2, drop="rollout/response_max_tokens_cap"), 2)[0] == \
        "step 1: no rollout/response_max_tokens_cap"
    assert smoke_problems(write_run(tmp_path / "noupdate", 2, drop="actor/pg_loss"), 2)[0] == \
        "step 1: no actor/* (no update)"


def test_smoke_result_spec_needs_the_acceptance_metrics_with_drafts(tmp_path, capsys):
    from recipe.gpu_check import SPEC_METRICS, main

    spec = dict(zip(SPEC_METRICS, (10.0, 40.0, 4.0, 0.1, 1.4)))
    assert smoke_problems(write_run(tmp_path / "ok", 2, spec=spec), 2, spec=True) == []
    assert main(["smoke-result", str(tmp_path / "ok"), "--steps", "2", "--spec"]) == 0
    assert "20 drafts, 80 draft tokens, 8 accepted (rate 0.100, acceptance length 1.400)" in capsys.readouterr().out
    assert smoke_problems(write_run(tmp_path / "plain", 2), 2, spec=True)[0] == "step 1: no " + ", ".join(SPEC_METRICS)
    assert smoke_problems(write_run(tmp_path / "idle", 2, spec={**spec, SPEC_METRICS[0]: 0.0}), 2, spec=True)[0] == \
        "step 1: no speculative drafts (rollout/spec_drafts is 0)"


def test_smoke_result_accepted_needs_accepted_drafts_and_reports_the_greedy_validations_rate(tmp_path, capsys):
    """--accepted (the tiny EAGLE-3 head): drafts accepted over the steps, else a failure even with every metric
    logged; the detail gives the rollout's and the greedy validation's acceptance rates."""
    from recipe.gpu_check import SPEC_METRICS, main

    spec = {**dict(zip(SPEC_METRICS, (10.0, 40.0, 4.0, 0.1, 1.4))), "draft_head/optimizer_steps": 8.0}
    val = {"val-aux/spec_drafts": 50.0, "val-aux/spec_draft_tokens": 200.0, "val-aux/spec_accepted_tokens": 30.0}
    write_run(tmp_path / "ok", 2, spec=spec, val=val)
    frozen = {k: v for k, v in spec.items() if not k.startswith("draft_head/")}
    assert smoke_problems(write_run(tmp_path / "frozen", 2, spec=frozen, val=val), 2, spec=True, accepted=True) == [
        "the online head (ROLLOUT_DRAFT_ONLINE=1) logged draft_head/* on steps [] of 1-2: no capture, training or "
        "push on the others"]
    assert main(["smoke-result", str(tmp_path / "ok"), "--steps", "2", "--accepted"]) == 0
    assert capsys.readouterr().out.strip().endswith(
        "speculative acceptance: 20 drafts, 80 draft tokens, 8 accepted (rate 0.100, acceptance length 1.400); "
        "greedy validation: 30 of 200 draft tokens accepted (rate 0.150)")
    none = write_run(tmp_path / "none", 2, spec={**spec, SPEC_METRICS[2]: 0.0, SPEC_METRICS[3]: 0.0}, val=val)
    assert smoke_problems(none, 2, spec=True) == []  # an untrained head may get none accepted
    assert smoke_problems(none, 2, spec=True, accepted=True) == [
        "no accepted draft tokens in steps 1-2 (rollout/spec_accepted_tokens is 0 or absent): the head never drafted "
        "a token the model sampled (a head for another model, or wrong hidden states)"]
    assert main(["smoke-result", str(none), "--steps", "2", "--accepted"]) == 1
    assert "no accepted draft tokens" in capsys.readouterr().out
    assert main(["smoke-result", str(write_run(tmp_path / "plain", 2)), "--steps", "2", "--accepted"]) == 1
    assert "step 1: no " + ", ".join(SPEC_METRICS) in capsys.readouterr().out  # --accepted implies --spec


def test_table_passes_only_when_every_step_passed(tmp_path):
    steps = tmp_path / "steps.tsv"
    steps.write_text("convert\tPASS\t41\tdone\nlogits\tPASS\t60\tmean KL 2e-06 | top-1 0.98\n")
    text, ok = format_table(read_steps(steps))
    assert ok and "| logits | PASS | 60 | mean KL 2e-06 / top-1 0.98 |" in text and text.endswith("gpu_check: PASS")
    steps.write_text(steps.read_text() + "smoke\tSKIP\t\tneeds the converted checkpoint\n")
    text, ok = format_table(read_steps(steps))
    assert not ok and "| smoke | SKIP |  | needs the converted checkpoint |" in text
    assert format_table([]) == ("| step | result | seconds | detail |\n|---|---|---|---|\ngpu_check: FAIL", False)
