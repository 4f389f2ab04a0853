"""The recipe's fix of vLLM CPU's expand shim (recipe/cpu/vllm_plugin.py, vLLM #55005): the rejection sampler's
per-token temperature and top_p are right with it, wrong without it, and the plugin applies it only where the
installed vLLM has the defect, only on the CPU platform, once, visibly."""
import logging

import pytest
import torch

# temperatures of 4 requests (0.0: greedy -> 1, as apply_sampling_constraints replaces it) and their tokens
TEMPERATURE = torch.tensor([0.03, 0.7, 0.0, 1.3])
TOP_P = torch.tensor([1.0, 0.9, 0.5, 0.95])
CU = torch.tensor([2, 5, 6, 8], dtype=torch.int32)
EXPECTED_TEMPERATURE = [0.03, 0.03, 0.7, 0.7, 0.7, 1.0, 1.3, 1.3]
EXPECTED_TOP_P = [1.0, 1.0, 0.9, 0.9, 0.9, 0.5, 0.95, 0.95]


def expand(kernel, values, replace_from=0, replace_to=0):
    """Call ``kernel`` as ``rejection_sampler.expand_batch_to_tokens`` does, into a NaN-filled output (so an output
    the kernel never writes is seen, not read as uninitialised memory)."""
    import vllm._C  # noqa: F401 - the C++ ops the shim calls

    out = torch.full((8,), float("nan"))
    kernel[(4,)](out, values, CU, replace_from, replace_to, MAX_NUM_TOKENS=128)
    return out


@pytest.fixture
def kernels():
    import vllm.utils.cpu_triton_utils as cpu_tl

    from recipe.cpu import vllm_plugin

    return {"vllm": cpu_tl._FuncWrapper(cpu_tl._expand_kernel_impl),  # vLLM's own shim, whatever is bound now
            "fixed": cpu_tl._FuncWrapper(vllm_plugin.expand_tokens)}


@pytest.mark.parametrize("which", ["fixed", "vllm"])
def test_expand_gives_each_draft_token_its_requests_temperature_and_top_p(kernels, which):
    temperature = expand(kernels[which], TEMPERATURE, replace_from=0, replace_to=1)
    top_p = expand(kernels[which], TOP_P)
    right = (torch.allclose(temperature, torch.tensor(EXPECTED_TEMPERATURE))
             and torch.allclose(top_p, torch.tensor(EXPECTED_TOP_P)))
    if which == "fixed":
        assert right, (temperature.tolist(), top_p.tolist())
    else:  # vLLM #55005: still broken in the installed vLLM (else drop the fix: tests/contract/test_cpu_shims.py)
        assert not right, "vLLM's CPU expand shim is fixed: recipe/cpu/vllm_plugin.py fix_spec_expand_kernel can go"
        assert temperature.isnan().all() and top_p.isnan().all()  # it never writes the float output


def test_fixed_expand_keeps_integers_and_the_tail(kernels):
    """top_k is int64 (vLLM's shim gets that right, and so must the fix); positions past cu[-1] are left alone."""
    out = torch.full((10,), -7, dtype=torch.int64)
    kernels["fixed"][(4,)](out, torch.tensor([-1, 20, 5, 3]), CU, 0, 0, MAX_NUM_TOKENS=128)
    assert out.tolist() == [-1, -1, 20, 20, 20, 5, 3, 3, -7, -7]
    empty = torch.full((2,), 1.5)
    kernels["fixed"][(0,)](empty, torch.tensor([]), torch.tensor([], dtype=torch.int32), 0, 1)
    assert empty.tolist() == [1.5, 1.5]


def test_rejection_sampler_gets_the_right_values_through_the_fix(monkeypatch):
    """Through vLLM's own ``expand_batch_to_tokens`` (as ``apply_sampling_constraints`` calls it) once the plugin
    fixed the kernel the CPU runner binds."""
    import vllm.utils.cpu_triton_utils as cpu_tl
    import vllm.v1.sample.rejection_sampler as rs

    from recipe.cpu import vllm_plugin

    monkeypatch.setattr(cpu_tl, "expand_kernel", cpu_tl._FuncWrapper(cpu_tl._expand_kernel_impl))
    monkeypatch.setattr(rs, "expand_kernel", cpu_tl.expand_kernel)  # as CPUModelRunner._postprocess_triton binds it
    defect = vllm_plugin.fix_spec_expand_kernel()
    assert defect and "nan" in defect
    assert rs.expand_kernel is cpu_tl.expand_kernel and getattr(rs.expand_kernel, vllm_plugin.MARK)
    temperature = rs.expand_batch_to_tokens(TEMPERATURE, CU, 8, replace_from=0, replace_to=1)
    assert torch.allclose(temperature, torch.tensor(EXPECTED_TEMPERATURE))
    assert torch.allclose(rs.expand_batch_to_tokens(TOP_P, CU, 8), torch.tensor(EXPECTED_TOP_P))
    assert vllm_plugin.fix_spec_expand_kernel() is None  # idempotent: every vLLM process calls the plugin


def test_fix_is_logged_and_can_be_turned_off(monkeypatch, caplog):
    import vllm.utils.cpu_triton_utils as cpu_tl

    from recipe.cpu import vllm_plugin

    broken = cpu_tl._FuncWrapper(cpu_tl._expand_kernel_impl)
    monkeypatch.setattr(cpu_tl, "expand_kernel", broken)
    monkeypatch.setenv(vllm_plugin.EXPAND_FIX_ENV, "0")
    assert vllm_plugin.fix_spec_expand_kernel() is None and cpu_tl.expand_kernel is broken
    monkeypatch.delenv(vllm_plugin.EXPAND_FIX_ENV)
    logger = logging.getLogger("vllm.plugins.recipe_cpu")
    monkeypatch.setattr(logger, "propagate", True)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.recipe_cpu"):
        assert vllm_plugin.fix_spec_expand_kernel()
    assert any(r.levelno == logging.WARNING and "expand_kernel replaced by a pure-torch expand" in r.getMessage()
               and "#55005" in r.getMessage() for r in caplog.records)


def test_a_correct_kernel_is_left_alone(monkeypatch):
    import vllm.utils.cpu_triton_utils as cpu_tl

    from recipe.cpu import vllm_plugin

    correct = cpu_tl._FuncWrapper(lambda *a, **kw: vllm_plugin.expand_tokens(*a, **kw))  # unmarked but right
    monkeypatch.setattr(cpu_tl, "expand_kernel", correct)
    assert vllm_plugin.expand_shim_defect(correct) is None
    assert vllm_plugin.fix_spec_expand_kernel() is None and cpu_tl.expand_kernel is correct


def test_a_kernel_that_writes_truncated_values_is_defective(kernels):
    """The other half of vLLM #55005 (the shim reads the input as integers): a kernel that writes the output, at the
    right positions, but the values truncated to integers, is reported with what it wrote; so is one that raises."""
    import vllm.utils.cpu_triton_utils as cpu_tl

    from recipe.cpu import vllm_plugin

    def truncating(output, input_val, *args, **kwargs):
        vllm_plugin.expand_tokens(output, input_val.to(torch.int64).to(input_val.dtype), *args, **kwargs)

    truncated = cpu_tl._FuncWrapper(truncating)
    assert expand(truncated, TOP_P).tolist() == [1, 1, 0, 0, 0, 0, 0, 0]  # it runs, at the right positions
    assert vllm_plugin.expand_shim_defect(truncated) == ("it expands the temperatures [0.5, 0 -> 1, 0.25] over "
                                                         "[2, 3, 1] tokens to [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]")

    def raising(*args, **kwargs):
        raise RuntimeError("no kernel")

    assert vllm_plugin.expand_shim_defect(cpu_tl._FuncWrapper(raising)) == "it raises RuntimeError: no kernel"
    assert vllm_plugin.expand_shim_defect(kernels["fixed"]) is None


def test_plugin_applies_the_fix_only_on_the_cpu_platform(monkeypatch):
    import vllm.platforms
    import vllm.utils.cpu_triton_utils as cpu_tl

    from recipe.cpu import vllm_plugin

    calls = []
    fixes = ("keep_linear_weights", "keep_moe_weight_loaders", "fix_spec_expand_kernel", "fix_spec_recovered_kernel", "capture_cpu_routing",
             "fix_moe_silu_entry")
    for name in fixes:
        monkeypatch.setattr(vllm_plugin, name, lambda name=name: calls.append(name))

    monkeypatch.setattr(vllm_plugin, "refuse_uncaptured_routing", lambda: calls.append("refuse_uncaptured_routing"))

    class Gpu:
        @staticmethod
        def is_cpu():
            return False

    monkeypatch.setattr(vllm.platforms, "current_platform", Gpu())
    vllm_plugin.apply()
    assert calls == ["refuse_uncaptured_routing"]  # off the CPU only the GPU half of the routing capture
    calls.clear()
    monkeypatch.undo()
    monkeypatch.setattr(cpu_tl, "expand_kernel", cpu_tl.expand_kernel)
    for name in fixes:
        monkeypatch.setattr(vllm_plugin, name, lambda name=name: calls.append(name))
    vllm_plugin.apply()  # this machine: vLLM's CPU platform
    assert calls == list(fixes)
