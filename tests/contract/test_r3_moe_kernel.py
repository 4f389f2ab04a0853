"""Routing replay (R3) against vLLM 0.24's MoE kernels and verl 0.9.1's server, pinned: which kernel skips the router
(where vLLM captures routes), on which GPUs vLLM picks it, the engine argument that forces another, and the sampling
field that returns only a turn's new routes. The preflight (recipe/preflight/router_replay.py), the loops' check
(recipe/adapter/routes.py) and the engine guard (recipe/cpu/vllm_plugin.py) rely on each."""
from types import SimpleNamespace

import pytest

from recipe.adapter.contract import check_module_source, check_order, check_source

RECHECK = "recipe/preflight/router_replay.py MOE_BACKEND_KEY and recipe/adapter/routes.py check_captured"
MOE = "vllm.model_executor.layers.fused_moe"


class Cuda:
    """vLLM's ``current_platform`` on a CUDA GPU of compute capability ``major``.x, FlashInfer installed."""

    def __init__(self, major):
        self.major = major

    is_cuda = staticmethod(lambda: True)
    is_rocm = is_xpu = is_cpu = is_tpu = is_out_of_tree = staticmethod(lambda: False)

    def is_device_capability_family(self, capability, device_id=0):
        return capability // 10 == self.major


def test_the_trtllm_bf16_moe_kernel_routes_inside_itself_and_runs_only_on_sm100(monkeypatch):
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.experts import trtllm_bf16_moe
    from vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe import FlashInferExperts
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    experts = trtllm_bf16_moe.TrtLlmBf16Experts
    assert issubclass(experts, mk.FusedMoEExpertsMonolithic), RECHECK  # handed the router logits, not topk ids
    check_source(f"{MOE}.experts.trtllm_bf16_moe:TrtLlmBf16Experts.apply", ["routing_logits=router_logits"], RECHECK)
    for modular in (TritonExperts, FlashInferExperts):  # the router selects, the kernel takes its ids
        assert issubclass(modular, mk.FusedMoEExpertsModular), (modular, RECHECK)
    monkeypatch.setattr(trtllm_bf16_moe, "has_flashinfer_trtllm_fused_moe", lambda: True)
    for major, supported in ((10, True), (9, False), (12, False)):
        monkeypatch.setattr(trtllm_bf16_moe, "current_platform", Cuda(major))
        assert experts._supports_current_device() is supported, (major, RECHECK)


def test_a_monolithic_kernel_never_calls_the_router_that_captures():
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    check_source(f"{MOE}.router.base_router:BaseRouter._select_experts",
                 ["if self.capture_fn is not None:", "self.capture_fn(topk_ids)"], RECHECK)
    calls = []
    runner = SimpleNamespace(
        _maybe_apply_shared_experts=lambda *a: None, _shared_experts=None, _quant_method=None,
        router=SimpleNamespace(select_experts=lambda **kw: calls.append("router")),
        routed_experts=SimpleNamespace(quant_method=SimpleNamespace(is_monolithic=True),
                                       forward_monolithic=lambda **kw: calls.append("kernel") or "out"))
    assert MoERunner._apply_quant_method(runner, "x", "logits", None) == (None, "out")
    assert calls == ["kernel"], RECHECK


@pytest.mark.parametrize("major,first", [(10, "FLASHINFER_TRTLLM"), (9, "TRITON")])
def test_vllm_ranks_the_trtllm_kernel_first_on_sm100_and_triton_first_on_hopper(monkeypatch, major, first):
    from vllm.model_executor.layers.fused_moe.oracle import unquantized

    monkeypatch.setattr(unquantized, "current_platform", Cuda(major))
    config = SimpleNamespace(moe_parallel_config=SimpleNamespace(dp_size=1))
    assert unquantized._get_priority_backends(config)[0].name == first, RECHECK


def test_moe_backend_triton_forces_a_routing_kernel_through_verls_engine_kwargs():
    """``+actor_rollout_ref.rollout.engine_kwargs.vllm.moe_backend=triton``: verl turns engine_kwargs.vllm into vLLM
    CLI arguments, vLLM's parser takes ``--moe-backend``, and the oracle honours it before its ranking."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.fused_moe.oracle import unquantized
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config

    from recipe.preflight.router_replay import IN_KERNEL_MOE_BACKEND, ROUTER_MOE_BACKENDS

    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ["**engine_kwargs,", "build_cli_args_from_config(args)"], RECHECK)
    cli = build_cli_args_from_config({"moe_backend": "triton"})  # --moe_backend: vLLM's parser takes either spelling
    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--model", "m", *cli])
    assert args.moe_backend == "triton" and "moe_backend" in EngineArgs.__dataclass_fields__, RECHECK
    check_source("vllm.engine.arg_utils:EngineArgs.create_engine_config",
                 ["kernel_config.moe_backend = self.moe_backend"], RECHECK)
    check_order(f"{MOE}.oracle.unquantized:select_unquantized_moe_backend", 'if runner_backend != "auto":',
                "for backend in AVAILABLE_BACKENDS:", RECHECK)
    kinds = {b: unquantized.map_unquantized_backend(b) for b in (*ROUTER_MOE_BACKENDS, IN_KERNEL_MOE_BACKEND)}
    assert [unquantized.backend_to_kernel_cls(k).__name__ for k in kinds.values()] == [
        "TritonExperts", "FlashInferExperts", "TrtLlmBf16Experts"], RECHECK


def test_routed_experts_prompt_start_reaches_vllms_scheduler_from_the_loops_sampling_params():
    """recipe.adapter.routes.NewRoutesOnly puts ``routed_experts_prompt_start`` into the loop's sampling params:
    verl's server builds vLLM's ``SamplingParams`` from that dict as it is, and vLLM's scheduler returns the prompt's
    routes from that token on (the rows after a prefill: generated tokens, unchanged)."""
    from vllm import SamplingParams

    from recipe.adapter.routes import PROMPT_START

    assert SamplingParams(max_tokens=1, **{PROMPT_START: 5}).routed_experts_prompt_start == 5
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ["sampling_params = SamplingParams(max_tokens=max_tokens, **sampling_params)"], RECHECK)
    check_source("vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
                 ["request.sampling_params.routed_experts_prompt_start",
                  "assert prompt_start < request.num_prompt_tokens", "token_start=prompt_start"], RECHECK)
    check_source(f"{MOE}.routed_experts_capturer:RoutedExpertsManager.get", ["token_start"], RECHECK)


# ---------------------------------------------- the preflight refuses it by name, before any GPU work

def r3_config(**vllm):
    from omegaconf import OmegaConf

    return OmegaConf.create({"actor_rollout_ref": {
        "actor": {"strategy": "megatron", "megatron": {"router_replay": {"mode": "R3"}}},
        "rollout": {"name": "vllm", "enable_rollout_routing_replay": True, "engine_kwargs": {"vllm": vllm}}}})


def preflight(monkeypatch, declared=None, visible=None, **vllm):
    """check_router_replay's errors and notes with ``RECIPE_GPU_CAPABILITY=declared`` and ``visible`` GPUs."""
    from recipe.preflight import router_replay

    if declared is None:
        monkeypatch.delenv(router_replay.CAPABILITY_VAR, raising=False)
    else:
        monkeypatch.setenv(router_replay.CAPABILITY_VAR, declared)
    monkeypatch.setattr(router_replay, "gpu_capabilities", lambda: visible)
    monkeypatch.setattr(router_replay, "installed_vllm", lambda: "0.24.0")
    errors, notes = [], []
    router_replay.check_router_replay(r3_config(**vllm), None, errors, notes)
    return errors, [n for n in notes if "MoE kernel" in n]


def test_r3_on_sm100_with_the_default_moe_backend_is_refused_naming_what_was_checked_and_the_fix(monkeypatch):
    fix = "+actor_rollout_ref.rollout.engine_kwargs.vllm.moe_backend=triton"
    (error,), _ = preflight(monkeypatch, declared="10.0")
    assert error.startswith("ROUTER_REPLAY=R3 on compute capability 10.0 (Blackwell, SM100; checked: "
                            "RECIPE_GPU_CAPABILITY=10.0) with vLLM's MoE backend on auto")
    assert "FlashInfer's TRT-LLM bf16 MoE kernel" in error and "every route would come back as expert 0" in error
    assert fix in error
    (error,), _ = preflight(monkeypatch, visible=["9.0", "10.0"])
    assert "compute capability 10.0 (Blackwell, SM100; checked: this node's GPUs (nvidia-smi: 9.0, 10.0))" in error
    # the declared capability is the rollout's (a launcher may hold other GPUs, or none)
    assert preflight(monkeypatch, declared="9.0", visible=["10.0"]) == ([], [])


@pytest.mark.parametrize("vllm", [{"moe_backend": "triton"}, {"moe_backend": "FlashInfer-CUTLASS"},
                                  {"kernel_config": {"moe_backend": "triton"}},
                                  {"kernel_config": '{"moe_backend": "triton"}'}])
def test_a_moe_backend_that_routes_outside_the_kernel_passes_on_sm100(monkeypatch, vllm):
    assert preflight(monkeypatch, declared="10.0", **vllm) == ([], [])


def test_hopper_passes_and_the_in_kernel_backend_is_refused_anywhere(monkeypatch):
    assert preflight(monkeypatch, visible=["9.0"] * 8) == ([], [])
    (error,), _ = preflight(monkeypatch, visible=["9.0"], moe_backend="flashinfer_trtllm")
    assert error.startswith("ROUTER_REPLAY=R3 with actor_rollout_ref.rollout.engine_kwargs.vllm.moe_backend="
                            "flashinfer_trtllm: FlashInfer's TRT-LLM MoE kernel selects the experts inside the kernel")
    # the kernel backend wins over kernel_config, as vLLM's EngineArgs.create_engine_config applies it
    (error,), _ = preflight(monkeypatch, visible=["9.0"], moe_backend="flashinfer_trtllm",
                            kernel_config={"moe_backend": "triton"})


def test_an_unknown_architecture_is_a_note_and_a_bad_declaration_an_error(monkeypatch):
    errors, (note,) = preflight(monkeypatch)
    assert errors == [] and note.startswith("R3's MoE kernel was NOT checked: no GPU is visible here and "
                                            "RECIPE_GPU_CAPABILITY is unset")
    assert preflight(monkeypatch, visible=["[N/A]"])[1] == [note]  # a driver without compute_cap: unknown
    (error,), notes = preflight(monkeypatch, declared="sm100")
    assert error.startswith("RECIPE_GPU_CAPABILITY='sm100' is not a compute capability") and notes == []


# ---------------------------------------------- the engine refuses it too, at its warm-up (recipe/cpu/vllm_plugin.py)

def fake_runner(monolithic, capture, calls):
    """A MoE runner as ``MoERunner._apply_quant_method`` reads it: FlashInfer's TRT-LLM kernel when ``monolithic``."""
    from vllm.model_executor.layers.fused_moe.experts.trtllm_bf16_moe import TrtLlmBf16Experts

    method = SimpleNamespace(is_monolithic=monolithic, experts_cls=TrtLlmBf16Experts, topk_indices_dtype=None,
                             unquantized_backend="FlashInfer TRTLLM")
    return SimpleNamespace(
        _maybe_apply_shared_experts=lambda *a: None, _shared_experts=None, _quant_method=method,
        router=SimpleNamespace(capture_fn=capture, select_experts=lambda **kw: calls.append("router") or (1, 2)),
        routed_experts=SimpleNamespace(quant_method=method,
                                       forward_monolithic=lambda **kw: calls.append("kernel") or "out",
                                       forward_modular=lambda **kw: calls.append("kernel") or "out"))


def test_on_a_gpu_the_engine_refuses_a_monolithic_kernel_while_it_captures_routes(monkeypatch):
    """Off the CPU the plugin wraps ``MoERunner._apply_quant_method``: a runner whose router holds vLLM's capture
    callback and whose kernel selects the experts itself raises at its first forward, naming the kernel and the fix;
    a kernel that takes the router's choice, or a runner that captures nothing (R3 off), runs as before."""
    import vllm.platforms
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    from recipe.cpu import vllm_plugin

    monkeypatch.setattr(vllm.platforms, "current_platform", Cuda(10), raising=False)
    vllm_own = MoERunner._apply_quant_method  # unwrapped: a CPU engine earlier in this process wraps it its own way
    while getattr(vllm_own, vllm_plugin.MARK, False):
        vllm_own = vllm_own.__wrapped__
    monkeypatch.setattr(MoERunner, "_apply_quant_method", vllm_own)
    vllm_plugin.apply()
    vllm_plugin.apply()  # every vLLM process calls it: wrapped once
    guard = MoERunner._apply_quant_method
    assert getattr(guard, vllm_plugin.MARK) and getattr(guard.__wrapped__, vllm_plugin.MARK, False) is False
    calls = []
    with pytest.raises(RuntimeError, match=r"monolithic MoE kernel TrtLlmBf16Experts \(FlashInfer TRTLLM\).*"
                                           r"expert 0.*engine_kwargs\.vllm\.moe_backend=triton"):
        guard(fake_runner(True, lambda ids: None, calls), "x", "logits", None)
    assert calls == []  # refused before the kernel ran
    assert guard(fake_runner(True, None, calls), "x", "logits", None) == (None, "out")
    assert guard(fake_runner(False, lambda ids: None, calls), "x", "logits", None) == (None, "out")
    assert calls == ["kernel", "router", "kernel"]
