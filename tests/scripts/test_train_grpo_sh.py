"""``bash scripts/train_grpo.sh`` end to end on a CPU machine: dry runs, the no-GPU stop, preflight failures.

Each run starts a Python and composes verl's config (~8 s here), so the switch combinations are covered in-process
(test_preflight_combos.py) and these tests cover what only the script does: building the command with the user's
arguments last, the resolved-config dump, the exit codes and messages, and choosing the smoke preset.
"""
import json
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_writes_the_command_and_dumps_the_resolved_config(run_script, env_30b, tmp_path, dry_run_words):
    dump = tmp_path / "resolved.json"
    env = {**env_30b, "DRY_RUN": "1", "PREFLIGHT_DUMP": str(dump), "VLLM_EAGER_BASELINE_NO_RESAMPLE": "1",
           "SAVE_CKPT_ENABLE": "1"}
    r = run_script("train_grpo.sh", env, "trainer.total_epochs=5", "trainer.test_freq=3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preflight: OK" in r.stdout and "pipeline layers  11 | 13 | 13 | 11" in r.stdout
    c = json.loads(dump.read_text())["config"]
    assert c["trainer"]["total_epochs"] == 5 and c["trainer"]["test_freq"] == 3  # the arguments win
    assert c["actor_rollout_ref"]["rollout"]["enforce_eager"] is True
    assert c["data"]["sampler"]["class_path"] is None and c["recipe"]["cap"]["enable"] == 0
    assert (c["trainer"]["save_freq"], c["trainer"]["resume_mode"]) == (20, "auto")
    run_dir = f"{env_30b['CKPT_ROOT']}/qwen3-30b-a3b-grpo-baseline-eager"  # the seed's baseline arm
    assert c["trainer"]["default_local_dir"] == run_dir
    assert not Path(run_dir).exists()  # a dry run writes nothing

    # The command goes to a file the output names, not to the terminal (a short summary); it is valid shell; its
    # words are the launch: env vars, recipe.main, the env overrides, the Hydra run dir inside the run directory,
    # and the user's arguments last.
    assert len(r.stdout.splitlines()) < 50 and "recipe.main" not in r.stdout
    words = dry_run_words(r.stdout)
    assert words[0] == "env" and f"WANDB_DIR={run_dir}" in words and "WANDB_MODE=offline" in words
    assert f"VERL_FILE_LOGGER_PATH={run_dir}/logs/metrics.20260101T000000Z.jsonl" in words
    assert words[words.index("-m") + 1] == "recipe.main"
    assert words[-2:] == ["trainer.total_epochs=5", "trainer.test_freq=3"]
    assert f"hydra.run.dir='{run_dir}/hydra/20260101T000000Z'" in words
    assert "trainer.total_epochs=3" in words  # the env default, overridden by the later argument


def test_no_model_and_no_gpu_defaults_to_the_cpu_preset(run_script, tmp_path, dry_run_words):
    """The main command without variables on a CPU machine runs the CPU preset (here as a dry run): a banner says
    what runs and how to run the real job, and the command composes verl's FSDP config with the CPU platform."""
    r = run_script("train_grpo.sh", {"DRY_RUN": "1", "CKPT_ROOT": str(tmp_path / "ck")}, gpus=0)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.startswith("train_grpo.sh: running the CPU preset (PRESET=cpu): MODEL_PATH is not set, no GPU")
    assert "MODEL_PATH=... DISTCP_PATH=..." in r.stderr
    assert "preflight: OK" in r.stdout and "verl's FSDP engine on the CPU" in r.stdout
    words = dry_run_words(r.stdout)
    assert "VERL_PLATFORM=cpu" in words and "VERL_USE_EXTERNAL_MODULES=recipe.cpu.verl_platform" in words
    assert words[words.index("--config-name") + 1] == "length_aware_grpo_cpu"
    assert f"trainer.default_local_dir='{tmp_path}/ck/cpu-grpo-resampler'" in words


def test_launch_without_gpu_runs_the_preflight_and_stops(run_script, env_30b):
    r = run_script("train_grpo.sh", env_30b, gpus=0)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "preflight: OK" in r.stdout
    assert "no GPU is visible on this machine" in r.stderr and "nothing was launched" in r.stderr
    assert "DRY_RUN=1" in r.stderr and "RAY_ADDRESS" in r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_preflight_reports_every_problem_at_once_without_a_traceback(run_script, env_30b):
    """Three mistakes, three problems in one run: a misspelled variable, a bad value (checked further with its
    default in its place) and a reward function the file lacks (found only after composing)."""
    r = run_script("train_grpo.sh", {**env_30b, "DRY_RUN": "1", "SAVE_CKPT_ENABLED": "1",
                                     "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "abc", "REWARD_FUNCTION_NAME": "nope"})
    assert r.returncode == 2
    errors = [line for line in r.stdout.splitlines() if line.startswith("preflight: ERROR: ")]
    assert len(errors) == 3 and "preflight: 3 problem(s)" in r.stdout, r.stdout
    assert "SAVE_CKPT_ENABLED is set but the recipe reads no such variable" in errors[0]
    assert "(did you mean SAVE_CKPT_ENABLE?)" in errors[0]
    assert "VLLM_ROLLOUT_EARLY_STOP_FACTOR='abc' must be a number" in errors[1]
    assert "nope" in errors[2]
    assert "preflight failed" in r.stderr and "Traceback" not in r.stdout + r.stderr


def test_a_misspelled_variable_is_refused_by_name(run_script, env_30b):
    r = run_script("train_grpo.sh", {**env_30b, "DRY_RUN": "1", "SAVE_CKPT_ENABLED": "1"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "preflight: ERROR: SAVE_CKPT_ENABLED is set" in r.stdout and "did you mean SAVE_CKPT_ENABLE?" in r.stdout


def test_the_real_runs_inputs_without_model_path_are_refused_not_a_preset(run_script, env_30b, tmp_path):
    """DISTCP_PATH, TRAIN_FILE or TEST_FILE without MODEL_PATH mean the real run: refused naming MODEL_PATH, on a
    CPU machine (no CPU preset on the user's data) and on a GPU one (no smoke preset beside a 30B checkpoint)."""
    for gpus in (0, 1):
        r = run_script("train_grpo.sh", {"DRY_RUN": "1", "CKPT_ROOT": str(tmp_path),
                                         "DISTCP_PATH": env_30b["DISTCP_PATH"]}, gpus=gpus)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "DISTCP_PATH set but MODEL_PATH is not" in r.stderr and "export MODEL_PATH=" in r.stderr
        assert "preset" not in r.stdout and "running" not in r.stderr  # refused before choosing a preset


def test_dry_run_on_a_gpu_node_checks_the_gpu_stack(run_script, env_30b):
    """With a GPU visible, a DRY_RUN checks the stack the launch needs: this CPU venv (no Megatron-Bridge, no
    Transformer Engine) is refused by part; without a GPU the report says the GPU stack was not checked."""
    on_gpu = run_script("train_grpo.sh", {**env_30b, "DRY_RUN": "1"}, gpus=1)
    assert on_gpu.returncode == 2, on_gpu.stdout + on_gpu.stderr
    errors = "\n".join(line for line in on_gpu.stdout.splitlines() if line.startswith("preflight: ERROR: "))
    assert "megatron-bridge" in errors.lower() and "transformer" in errors.lower(), on_gpu.stdout
    assert "preflight: OK" not in on_gpu.stdout
    off_gpu = run_script("train_grpo.sh", {**env_30b, "DRY_RUN": "1"}, gpus=0)
    assert off_gpu.returncode == 0, off_gpu.stdout + off_gpu.stderr
    assert "the GPU stack (Megatron-Bridge, Transformer Engine, vLLM's CUDA build) was NOT checked" in off_gpu.stdout


def test_gpu_machine_without_model_path_defaults_to_the_smoke_preset(run_script, tmp_path):
    """The bare command on a GPU machine: the smoke preset, said on the first line with why. (This CPU venv lacks
    the GPU stack a GPU node's DRY_RUN checks: the stand-in python below checks the CPU one.)"""
    import sys

    py = tmp_path / "python"
    py.write_text(f"#!/usr/bin/env bash\nRECIPE_STACK_TARGET=cpu exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    r = run_script("train_grpo.sh", {"DRY_RUN": "1", "CKPT_ROOT": str(tmp_path), "RECIPE_PYTHON": str(py)}, gpus=1)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.startswith("train_grpo.sh: running the 1-GPU smoke preset (PRESET=smoke): MODEL_PATH is not set")
    assert r.stdout.startswith("preflight: preset smoke\n")
    assert "preset           smoke" in r.stdout
    assert "the smoke preset converts the tiny model into it at launch" in r.stdout
    assert f"run dir          {tmp_path}/smoke-grpo-resampler" in r.stdout


def test_cluster_launcher_without_model_path_asks_for_it(run_script, tmp_path):
    """Joining a Ray cluster (RAY_ADDRESS) from a machine without a GPU is a real launch, not the CPU preset."""
    r = run_script("train_grpo.sh", {"DRY_RUN": "1", "CKPT_ROOT": str(tmp_path), "RAY_ADDRESS": "10.0.0.1:6379"},
                   gpus=0)
    assert r.returncode == 2 and "CPU preset" not in r.stderr
    assert "MODEL_PATH is not set: export MODEL_PATH=" in r.stdout and "PRESET=smoke" in r.stdout


def test_plan_file_round_trips_odd_paths(tmp_path, env_30b, tiny_artifacts):
    """The launch plan is sourced by bash: paths with spaces and quotes must come back unchanged."""
    import os
    import sys

    odd = tmp_path / "it's a dir"
    odd.mkdir()
    train = odd / "train.parquet"
    train.write_bytes(tiny_artifacts.train_parquet.read_bytes())
    plan = tmp_path / "plan.sh"
    env = {**os.environ, **env_30b, "TRAIN_FILE": str(train), "CKPT_ROOT": str(odd)}
    r = subprocess.run([sys.executable, "-m", "recipe.preflight", "--plan-out", str(plan)], env=env, cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = subprocess.run(["bash", "-c", f'source {shlex.quote(str(plan))}; printf "%s\\n" "$PLAN_RUN_DIR" '
                          '"${PLAN_OVERRIDES[@]}"'], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == f"{odd}/qwen3-30b-a3b-grpo-resampler"
    assert f'data.train_files="{train}"' in out  # Hydra's double quotes around a path holding a single quote


def test_launch_on_a_gpu_machine_converts_tees_and_passes_the_exit_status(run_script, tmp_path):
    """The launch path with a faked GPU: a stand-in interpreter runs the real preflight but intercepts the
    conversion (torchrun) and ``recipe.main`` (it prints what it got and exits 7)."""
    import sys

    py = tmp_path / "python"
    py.write_text(f"""#!/usr/bin/env bash
if [[ "$1 $2" == "-m recipe.preflight" ]]; then
    # the script asks for the GPU stack; this is the CPU venv (the stack check has its own tests)
    echo "STACK_TARGET=$RECIPE_STACK_TARGET" >> {tmp_path}/stack-target
    RECIPE_STACK_TARGET=cpu exec {sys.executable} "$@"
fi
if [[ "$1 $2" == "-m recipe.main" ]]; then
    shift 2; echo "MAIN WANDB_MODE=$WANDB_MODE VERL_FILE_LOGGER_PATH=$VERL_FILE_LOGGER_PATH"
    printf '%s\\n' "$@"; exit 7
fi
if [[ "$1 $2" == "-m torch.distributed.run" ]]; then
    while [[ $# -gt 0 && "$1" != --output_path ]]; do shift; done
    mkdir -p "$2"; echo '{{"sharded_backend": "torch_dist"}}' > "$2/metadata.json"; echo "CONVERTED $2"; exit 0
fi
exec {sys.executable} "$@"
""")
    py.chmod(0o755)
    distcp = tmp_path / "smoke-distcp"  # never the shared fixture cache: this checkpoint is fake
    env = {"PRESET": "smoke", "RECIPE_PYTHON": str(py), "DISTCP_PATH": str(distcp), "CKPT_ROOT": str(tmp_path)}
    r = run_script("train_grpo.sh", env, "trainer.total_epochs=1", gpus=1)
    assert r.returncode == 7, r.stdout + r.stderr
    assert f"CONVERTED {distcp}" in r.stdout and (distcp / "metadata.json").exists()
    assert (tmp_path / "stack-target").read_text().split()[0] == "STACK_TARGET=gpu"  # (then the converter's)
    run_dir = tmp_path / "smoke-grpo-resampler"
    logs = sorted((run_dir / "logs").iterdir())
    assert [p.name.split(".")[0] for p in logs] == ["console"]  # verl creates metrics.*.jsonl itself
    console = logs[0].read_text()
    assert console.startswith("preflight: preset smoke\npreflight: resolved settings")
    assert f"CONVERTED {distcp}" in console
    main_out, finished = console.split("MAIN ", 1)[1].rsplit("train_grpo.sh: where the run is:", 1)
    main_out = main_out.splitlines()
    assert main_out[0] == (f"WANDB_MODE=offline VERL_FILE_LOGGER_PATH={run_dir}/logs/"
                           f"{logs[0].name.replace('console', 'metrics').replace('.log', '.jsonl')}")
    assert main_out[1:3] == ["--config-name", "length_aware_grpo"]
    assert main_out[-1] == "trainer.total_epochs=1" and main_out[3].startswith("actor_rollout_ref.model.path=")
    assert finished.rstrip().splitlines()[-1] == f"train_grpo.sh: finished with status 7; run dir {run_dir}"
    assert f"{run_dir}/length_traces.jsonl" in finished
    # the terminal: the recipe's lines only, and on a failure the log's last lines
    assert "MAIN " not in r.stdout.split("the run failed (status 7)")[0] and "the run failed (status 7)" in r.stdout
