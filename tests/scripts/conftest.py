"""Fixtures for the launch-script tests: model dirs, a stand-in dist checkpoint, environments, a script runner.

Nothing here needs a GPU. The dist checkpoint is a structural stand-in (the files megatron-core's
``dist_checkpointing.save`` writes, empty): a real conversion needs NCCL, and the preflight only inspects the layout.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Qwen/Qwen3-30B-A3B config.json (the values the preflight's layout checks read, plus the rest of the real file).
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}


def write_fake_distcp(path: Path) -> Path:
    """What ``dist_checkpointing.save`` leaves (torch_dist backend), without tensors: a structural stand-in."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                    "common_backend": "torch", "common_backend_version": 1}))
    (path / "common.pt").write_bytes(b"")
    (path / ".metadata").write_bytes(b"")
    (path / "__0_0.distcp").write_bytes(b"")
    return path


@pytest.fixture(scope="session")
def fake_distcp(tmp_path_factory):
    return write_fake_distcp(tmp_path_factory.mktemp("distcp") / "qwen3-mcore")


@pytest.fixture(scope="session")
def qwen3_30b_dir(tmp_path_factory, tiny_artifacts):
    """A model dir with Qwen3-30B-A3B's real config.json and the tiny tokenizer (no weights: never loaded here)."""
    out = tmp_path_factory.mktemp("models") / "Qwen3-30B-A3B"
    out.mkdir()
    for f in tiny_artifacts.model_dir.iterdir():
        if f.name not in ("config.json", "generation_config.json") and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    (out / "config.json").write_text(json.dumps(QWEN3_30B_A3B_CONFIG))
    return out


@pytest.fixture(scope="session")
def env_30b(qwen3_30b_dir, fake_distcp, tiny_artifacts, tmp_path_factory):
    """The defaults (2 x 8 GPUs, Qwen3-30B-A3B layout): only the inputs are set."""
    return {
        "MODEL_PATH": str(qwen3_30b_dir),
        "DISTCP_PATH": str(fake_distcp),
        "TRAIN_FILE": str(tiny_artifacts.train_parquet),
        "TEST_FILE": str(tiny_artifacts.test_parquet),
        "CKPT_ROOT": str(tmp_path_factory.mktemp("ckpt")),
        "RECIPE_LAUNCH_STAMP": "20260101T000000Z",
    }


@pytest.fixture(scope="session")
def env_tiny(env_30b, tiny_artifacts):
    """The tiny model (4 layers, 8 experts) on one 8-GPU node: TP 2 x PP 2, EP 4, even split, 2k responses."""
    return {**env_30b, "MODEL_PATH": str(tiny_artifacts.model_dir), "NNODES": "1", "ACTOR_PP": "2",
            "ACTOR_PP_FIRST_LAYERS": "0", "ACTOR_PP_LAST_LAYERS": "0", "MAX_RESPONSE_LENGTH": "2048",
            "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "512"}


def fake_nvidia_smi(bin_dir: Path, gpus: int) -> Path:
    """An ``nvidia-smi`` that lists ``gpus`` GPUs (0: prints the driver's "No devices were found" and fails)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})"\n' for i in range(gpus))
    body = lines if gpus else 'echo "No devices were found"\nexit 6\n'
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/usr/bin/env bash\n" + body)
    script.chmod(0o755)
    return script


@pytest.fixture
def make_nvidia_smi():
    return fake_nvidia_smi


@pytest.fixture
def run_script(tmp_path):
    """Run ``bash scripts/<name>`` with ``env`` on top of a clean base; ``gpus`` fakes nvidia-smi's listing."""

    def run(name: str, env: dict, *args: str, gpus: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
        bin_dir = tmp_path / f"bin-{gpus}"
        fake_nvidia_smi(bin_dir, gpus)
        base = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR", "RECIPE_FIXTURE_CACHE",
                                                             "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        full = {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECIPE_PYTHON": sys.executable, **env}
        return subprocess.run(["bash", str(REPO / "scripts" / name), *args], env=full, cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def dry_run_words():
    """The launch command a ``DRY_RUN=1`` of ``train_grpo.sh`` wrote to the file its last line names, as shell words."""
    import re
    import shlex

    def words(stdout: str) -> list[str]:
        path = re.search(r"the full command is in (\S+) ", stdout).group(1)
        return shlex.split(Path(path).read_text().replace("\\\n", " "))

    return words
