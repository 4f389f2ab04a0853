"""Megatron-Bridge models of the tiny Qwen3-MoE on Megatron-Core's local layer spec, and the batch they are checked on.

The overrides are verl 0.9.1's own (``verl/workers/engine/megatron/transformer_impl.py``) less those that need
Transformer Engine or CUDA kernels (fusions, grouped GEMM, the flash/fused attention backends). On the CPU the MoE
token dispatcher is ``allgather`` (``alltoall`` needs CUDA streams; ``allgather`` needs fixed sequence lengths) and
parameters are created in host memory.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1

    @property
    def name(self) -> str:
        return f"tp{self.tp}-ep{self.ep}"


def init_parallel(layout: Layout, cpu: bool) -> None:
    """(Re)initialise Megatron's process groups for ``layout`` (torch.distributed must be up)."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(tensor_model_parallel_size=layout.tp, expert_model_parallel_size=layout.ep)
    if cpu:  # Megatron's RNG tracker forks CUDA RNG states; there are none on a CPU
        tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(0)


def provider(model_dir: str, cpu: bool, layout: Layout = Layout()):
    """``(bridge, provider)`` for ``model_dir`` with the local layer spec; fp32 on the CPU, bf16 on a GPU."""
    import torch
    from megatron.bridge import AutoBridge
    from megatron.bridge.models.gpt_provider import local_layer_spec
    from megatron.core.transformer.enums import AttnBackend

    bridge = AutoBridge.from_hf_pretrained(model_dir)
    p = bridge.to_megatron_provider(load_weights=False)
    p.transformer_layer_spec = local_layer_spec
    overrides = dict(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=1, expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=1, context_parallel_size=1, sequence_parallel=False,  # torch norms: no SP
        variable_seq_lengths=not cpu, moe_token_dispatcher_type="allgather" if cpu else "alltoall",
        moe_router_load_balancing_type="none", attention_backend=AttnBackend.local, batch_p2p_comm=False,
        moe_grouped_gemm=False, moe_permute_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        cross_entropy_loss_fusion=False, use_cpu_initialization=cpu)
    p.apply_overrides_and_finalize(dtype=torch.float32 if cpu else torch.bfloat16, overrides=overrides)
    return bridge, p


def build(p, cpu: bool, seed: int, ddp: bool = False):
    """A freshly initialised model (a list of chunks, as verl holds it), seeded so two builds differ."""
    import torch

    torch.manual_seed(seed)
    kwargs = {}
    if ddp:
        from megatron.core.distributed import DistributedDataParallelConfig

        kwargs["ddp_config"] = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
    return p.provide_distributed_model(wrap_with_ddp=ddp, use_cpu_initialization=cpu, **kwargs)


def unwrapped(model):
    from verl.utils.megatron_utils import unwrap_model

    return unwrap_model(model[0])


class Batch:
    """Fixed random tokens (:data:`recipe.gpu_check.TOKENS_SHAPE`, seed 0) with a causal mask."""

    def __init__(self, vocab: int, device: str):
        import torch

        from ..gpu_check import TOKENS_SHAPE

        batch, seq = TOKENS_SHAPE
        self.vocab = vocab
        self.ids = torch.randint(0, vocab, TOKENS_SHAPE, generator=torch.Generator().manual_seed(0)).to(device)
        self.positions = torch.arange(seq, device=device).expand_as(self.ids)
        self.mask = torch.triu(torch.ones(seq, seq, device=device), diagonal=1).bool()[None, None]  # True = masked

    def logits(self, model, grad: bool = False):
        import torch

        with contextlib.nullcontext() if grad else torch.no_grad():
            out = model[0](input_ids=self.ids, position_ids=self.positions, attention_mask=self.mask)
        return out[..., :self.vocab].float()  # the output layer is padded to a multiple of 128

    def loss(self, model):
        import torch.nn.functional as F

        logits = self.logits(model, grad=True)
        return F.cross_entropy(logits[:, :-1].reshape(-1, self.vocab), self.ids[:, 1:].reshape(-1))


def hf_logits(model_dir: str, batch: Batch, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        return hf(input_ids=batch.ids).logits.float()


def _expert_weights(experts, linear: str) -> dict:
    """TE's grouped-GEMM names (``weight0``, ``weight1``, ...) for the local spec's per-expert linears."""
    return {f"weight{i}": getattr(e, linear).weight for i, e in enumerate(experts)}


def converter_view(model):
    """The attribute paths verl's converter writes (TE layer spec: ``linear_qkv.layer_norm_weight``, grouped experts'
    ``weight{i}``) pointing at the local spec's parameters, so the converter's own mapping code fills a local model."""
    layers = []
    for layer in model.decoder.layers:
        attn, experts = layer.self_attention, layer.mlp.experts.local_experts
        layers.append(SimpleNamespace(
            self_attention=SimpleNamespace(
                linear_qkv=SimpleNamespace(layer_norm_weight=layer.input_layernorm.weight,
                                           weight=attn.linear_qkv.weight),
                q_layernorm=attn.q_layernorm, k_layernorm=attn.k_layernorm, linear_proj=attn.linear_proj),
            pre_mlp_layernorm=layer.pre_mlp_layernorm,
            mlp=SimpleNamespace(router=layer.mlp.router, experts=SimpleNamespace(
                linear_fc1=SimpleNamespace(_parameters=_expert_weights(experts, "linear_fc1")),
                linear_fc2=SimpleNamespace(_parameters=_expert_weights(experts, "linear_fc2"))))))
    return SimpleNamespace(embedding=model.embedding, output_layer=model.output_layer,
                           decoder=SimpleNamespace(layers=layers, final_layernorm=model.decoder.final_layernorm))
