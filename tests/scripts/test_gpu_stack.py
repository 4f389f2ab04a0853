"""requirements/gpu.txt resolves for the GPU target, proven on a CPU machine with pip's resolver: ``pip install
--dry-run --report`` for CPython 3.12 on manylinux x86_64 (glibc 2.31), binary wheels only, nothing installed.

Needs PyPI (``-m "not network"`` deselects it). pip >= 24.2 is required: older pips check Requires-Python against the
running interpreter instead of ``--python-version``, so the test runs a pinned pip wheel. Wall time is dominated by
downloads: with PyPI's PEP 658 metadata pip fetches only each wheel's METADATA; an index without it (this project's
proxy strips it) makes pip download every candidate wheel (~5 GB, 1.5-3 min here).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging import tags
from packaging.utils import parse_wheel_filename

pytestmark = [pytest.mark.network, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PIP = "pip==25.3"
PYTHON = "3.12"
GLIBC_MINOR = 31  # llguidance 1.7 (vLLM 0.24.0's pin) is manylinux_2_31 only; torch 2.11.0 is manylinux_2_28
# pip matches platform tags exactly: every tag a glibc-2.31 x86_64 machine accepts, newest first.
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
# Pure-Python sdists the stack needs (no wheel on PyPI): built locally once, offered with --find-links.
SDIST_ONLY = {"antlr4-python3-runtime": "4.9.3"}  # hydra-core 1.3.x pins antlr4-python3-runtime==4.9.*


def pip_env() -> dict:
    """PyPI (or $PIP_INDEX_URL) only: no config files, local wheel dirs or extra indexes of this machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") or k in ("PIP_INDEX_URL", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_PROXY")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def run_pip(pip: list[str], *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*pip, *args], env=pip_env(), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"pip {' '.join(args)}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r


def target_args() -> list[str]:
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    return ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp", "--abi", "cp312",
            *platforms]


@pytest.fixture(scope="module")
def pip(tmp_path_factory) -> list[str]:
    """A pinned pip, run from its wheel by the test interpreter (not 3.12: the target is only pip's flags)."""
    assert sys.version_info[:2] != (3, 12), "the point is resolving for 3.12 from another Python"
    where = tmp_path_factory.mktemp("pip")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", PIP,
                    "-d", str(where)], env=pip_env(), check=True, capture_output=True, timeout=300)
    return [sys.executable, str(next(where.glob("pip-*.whl")) / "pip")]


@pytest.fixture(scope="module")
def resolution(pip, tmp_path_factory) -> dict[str, dict]:
    """pip's report for requirements/gpu.txt, by canonical package name."""
    tmp = tmp_path_factory.mktemp("gpu-resolve")
    local = tmp / "wheels"
    run_pip(pip, "wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", str(local),
            *(f"{name}=={version}" for name, version in SDIST_ONLY.items()))
    report = tmp / "report.json"
    run_pip(pip, "install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
            "--find-links", str(local), *target_args(), "-r", str(REPO / "requirements" / "gpu.txt"))
    return {canonical(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path: Path) -> dict[str, str]:
    """canonical name -> version of the ``name[extras]==version`` lines."""
    out = {}
    for line in path.read_text().splitlines():
        if m := re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line.strip()):
            out[canonical(m.group(1))] = m.group(3)
    return out


def wheel_name(item: dict) -> str:
    return item["download_info"]["url"].rsplit("/", 1)[-1]


def test_gpu_stack_resolves_with_every_pin_honoured(resolution):
    pins = pinned(REPO / "requirements" / "gpu.txt")
    assert {"verl", "vllm", "torch", "megatron-core", "transformer-engine"} <= set(pins)
    got = {name: resolution[name]["metadata"]["version"] for name in pins}
    assert got == pins
    assert "transformer-engine-cu13" in resolution  # the [core_cu13] extra's binary core


def test_gpu_stack_is_binary_wheels_for_cpython312_glibc231(resolution):
    """Every package is a wheel from the index that CPython 3.12 on that platform accepts, except the sdist-only
    pure-Python ones, which come from the locally built wheel."""
    accepted = {*tags.cpython_tags((3, 12), platforms=PLATFORMS),
                *tags.compatible_tags((3, 12), interpreter="cp312", platforms=PLATFORMS)}
    for name, item in resolution.items():
        wheel = wheel_name(item)
        assert wheel.endswith(".whl"), wheel
        assert parse_wheel_filename(wheel)[3] & accepted, wheel
        from_local = item["download_info"]["url"].startswith("file:")
        assert from_local == (name in SDIST_ONLY), wheel


def test_gpu_stack_torch_is_a_cuda13_build(resolution):
    """The driver requirement in docs/install-gpu.md (>= 580) follows from this: CUDA 13 runtime, no cu12 parts."""
    requires = resolution["torch"]["metadata"]["requires_dist"]
    assert any(re.match(r"cuda-toolkit\[[^\]]*\]==13\.", r) for r in requires), requires
    assert any(r.startswith("nvidia-nccl-cu13") for r in requires)
    cuda_parts = [n for n in resolution if re.search(r"-cu1\d$", n)]
    assert cuda_parts and all(n.endswith("-cu13") for n in cuda_parts), cuda_parts


def test_gpu_stack_no_deps_parts_have_wheels_for_the_target(pip, tmp_path):
    """What python_env.sh installs with --no-deps (megatron-bridge) exists as a wheel for CPython 3.12."""
    report = tmp_path / "report.json"
    path = REPO / "requirements" / "gpu-no-deps.txt"
    run_pip(pip, "install", "--dry-run", "--ignore-installed", "--no-deps", "-q", "--report", str(report),
            *target_args(), "-r", str(path))
    installs = json.loads(report.read_text())["install"]
    got = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    assert got == pinned(path)
