"""``scripts/convert_hf_to_distcp.sh`` (dry runs and refusals; a real conversion needs NCCL) and the interpreter
choice of ``scripts/lib/python_env.sh``, tested with stand-in interpreters so nothing is installed."""
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def words_after_dry_run(stdout: str) -> list[str]:
    return shlex.split(stdout.split("the command (not run):\n", 1)[1])


def test_convert_defaults_to_one_rank_whatever_the_training_layout(run_script, tiny_artifacts, tmp_path):
    """Each rank loads the whole HF model into host memory; the checkpoint reshards at load (tests/megatron)."""
    env = {"DRY_RUN": "1", "MODEL_PATH": str(tiny_artifacts.model_dir), "DISTCP_PATH": str(tmp_path / "out"),
           "ACTOR_PP": "4", "ACTOR_EP": "4"}
    r = run_script("convert_hf_to_distcp.sh", env)
    assert r.returncode == 0, r.stdout + r.stderr
    w = words_after_dry_run(r.stdout)
    assert "--nproc_per_node=1" in w and "--standalone" in w
    assert w[w.index("--pp_size") + 1] == "1" and w[w.index("--ep_size") + 1] == "1"


def test_convert_dry_run_uses_the_given_layout_and_verls_converter(run_script, tiny_artifacts, tmp_path):
    env = {"DRY_RUN": "1", "MODEL_PATH": str(tiny_artifacts.model_dir), "DISTCP_PATH": str(tmp_path / "out"),
           "CONVERT_PP": "2", "CONVERT_EP": "4"}
    r = run_script("convert_hf_to_distcp.sh", env)
    assert r.returncode == 0, r.stdout + r.stderr
    w = words_after_dry_run(r.stdout)
    assert w[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc_per_node=8" in w
    assert w[w.index("--pp_size") + 1] == "2" and w[w.index("--ep_size") + 1] == "4"
    converter = Path(w[w.index("--nproc_per_node=8") + 1])
    assert converter.name == "converter_hf_to_mcore.py" and "site-packages" in converter.parts
    source = converter.read_text()  # the flags exist in verl 0.9.1's argparse
    for flag in ("--hf_model_path", "--output_path", "--pp_size", "--ep_size", "--use_cpu_initialization"):
        assert f'"{flag}"' in source
    assert w[w.index("--output_path") + 1] == str(tmp_path / "out")


def test_convert_over_two_nodes_needs_node_rank_and_master(run_script, tiny_artifacts, tmp_path):
    env = {"DRY_RUN": "1", "MODEL_PATH": str(tiny_artifacts.model_dir), "DISTCP_PATH": str(tmp_path / "out"),
           "CONVERT_PP": "4", "CONVERT_EP": "4"}  # 16 ranks, 8 GPUs a node
    r = run_script("convert_hf_to_distcp.sh", env)
    assert r.returncode == 2
    assert "CONVERT_NNODES=2: run this script on each node with NODE_RANK=0..1 and MASTER_ADDR" in r.stderr
    r = run_script("convert_hf_to_distcp.sh", {**env, "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                                               "CONVERT_CPU_INIT": "1"})
    assert r.returncode == 0, r.stderr
    w = words_after_dry_run(r.stdout)
    assert {"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--nproc_per_node=8",
            "--use_cpu_initialization"} <= set(w)


def test_convert_refuses_a_non_empty_output_dir(run_script, tiny_artifacts, fake_distcp):
    r = run_script("convert_hf_to_distcp.sh", {"DRY_RUN": "1", "MODEL_PATH": str(tiny_artifacts.model_dir),
                                               "DISTCP_PATH": str(fake_distcp)})
    assert r.returncode == 2
    assert f"DISTCP_PATH={fake_distcp} is not empty" in r.stderr and "rm -rf" in r.stderr


def test_convert_needs_a_gpu_unless_dry_run(run_script, tiny_artifacts, tmp_path):
    env = {"MODEL_PATH": str(tiny_artifacts.model_dir), "DISTCP_PATH": str(tmp_path / "out")}
    r = run_script("convert_hf_to_distcp.sh", env, gpus=0)
    assert r.returncode == 2 and "no GPU is visible" in r.stderr and "DRY_RUN=1" in r.stderr


@pytest.mark.parametrize("env,message", [
    ({"MODEL_PATH": ""}, "MODEL_PATH is not set"),
    ({"DISTCP_PATH": ""}, "DISTCP_PATH is not set"),
    ({"MODEL_PATH": "/nonexistent"}, "MODEL_PATH=/nonexistent has no config.json"),
    ({"CONVERT_EP": "0"}, "CONVERT_EP=0 must be a positive integer"),
    ({"GPUS_PER_NODE": "x"}, "GPUS_PER_NODE='x' must be an integer"),
    ({"CONVERT_CPU_INIT": "yes"}, "CONVERT_CPU_INIT=yes must be 0 or 1"),
    ({"CONVERT_EP": "2", "MODEL_PATH": "DENSE"}, "converts only MoE models"),
])
def test_convert_input_errors(run_script, tiny_artifacts, tmp_path, env, message):
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    base = {"DRY_RUN": "1", "MODEL_PATH": str(tiny_artifacts.model_dir), "DISTCP_PATH": str(tmp_path / "o"),
            "CONVERT_PP": "1", "CONVERT_EP": "1"}
    env = {k: str(dense) if v == "DENSE" else v for k, v in env.items()}
    r = run_script("convert_hf_to_distcp.sh", {**base, **env})
    assert r.returncode == 2 and message in r.stderr, r.stderr


# ---- scripts/lib/python_env.sh ---------------------------------------------------------------------------------

@pytest.fixture
def python_env(tmp_path, make_nvidia_smi):
    """A copy of the libs in a fake repo root, with stand-in interpreters on PATH: a python3 without verl that
    creates venvs whose python only logs its arguments, and a bootstrap_venv.sh that only records that it ran.
    Returns ``choose(gpus, **env) -> (completed process, log lines)``."""
    root = tmp_path / "repo"
    (root / "scripts" / "lib").mkdir(parents=True)
    (root / "requirements").mkdir()
    (root / "requirements" / "gpu.txt").write_text("verl[megatron,vllm]==0.9.1\n")
    for lib in ("python_env.sh", "gpu.sh"):
        shutil.copy(REPO / "scripts" / "lib" / lib, root / "scripts" / "lib" / lib)
    log = tmp_path / "log"
    (root / "scripts" / "bootstrap_venv.sh").write_text(f'echo bootstrap >> "{log}"\n')
    bin_dir = tmp_path / "bin"
    venv_python = f'#!/usr/bin/env bash\necho "venv-python $*" >> "{log}"\n'
    make_nvidia_smi(bin_dir, 0)
    (bin_dir / "python3").write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1" == "-c" ]]; then exit 1; fi\n'  # `import verl` fails
        'if [[ "$1 $2" == "-m venv" ]]; then mkdir -p "$3/bin"; '
        f"printf '%s' {shlex.quote(venv_python)} > \"$3/bin/python\"; chmod +x \"$3/bin/python\"; fi\n")
    (bin_dir / "python3").chmod(0o755)

    def choose(gpus: int = 0, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
        make_nvidia_smi(bin_dir, gpus)
        lib = shlex.quote(str(root / "scripts" / "lib" / "python_env.sh"))
        script = f"source {lib}; recipe_python {shlex.quote(str(root))}"
        r = subprocess.run(["bash", "-c", script], env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env},
                           capture_output=True, text=True)
        return r, (log.read_text().splitlines() if log.exists() else [])

    choose.root = root
    return choose


def test_recipe_python_wins_and_is_made_absolute(python_env):
    r, _ = python_env(RECIPE_PYTHON="/bin/sh")
    assert r.returncode == 0 and r.stdout.strip() == "/bin/sh"
    r, _ = python_env(RECIPE_PYTHON="/no/such/python")
    assert r.returncode == 1 and "RECIPE_PYTHON=/no/such/python is not an executable" in r.stderr


def test_cpu_machine_falls_back_to_the_test_venv(python_env):
    r, log = python_env(gpus=0)
    assert r.stdout.strip() == f"{python_env.root}/.venv/bin/python"
    assert log == ["bootstrap"] and "preflight and DRY_RUN only" in r.stderr


def test_gpu_machine_creates_venv_gpu_once(python_env):
    root = python_env.root
    r, log = python_env(gpus=2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{root}/.venv-gpu/bin/python"
    assert log == [f"venv-python -m pip install --disable-pip-version-check -q -r {root}/requirements/gpu.txt",
                   "venv-python -m pip install --disable-pip-version-check -q --no-deps "
                   f"-r {root}/requirements/gpu-no-deps.txt",
                   f"venv-python -m pip install --disable-pip-version-check -q -e {root} "
                   "--config-settings editable_mode=compat",
                   "venv-python -m recipe.stack_versions --target gpu"]
    assert (root / ".venv-gpu" / ".recipe-gpu-ready").exists()
    r, log2 = python_env(gpus=0)  # once ready it is used, GPU or not, without reinstalling
    assert r.stdout.strip() == f"{root}/.venv-gpu/bin/python" and log2 == log


def test_half_installed_venv_gpu_is_not_used(python_env):
    (python_env.root / ".venv-gpu" / "bin").mkdir(parents=True)
    (python_env.root / ".venv-gpu" / "bin" / "python").write_text("")
    r, log = python_env(gpus=0)
    assert r.stdout.strip() == f"{python_env.root}/.venv/bin/python" and log == ["bootstrap"]
