"""The CUDA calls Megatron-Core makes outside the math, answered on a CPU: the rehearsal of the one-GPU check.

Megatron-Core names ``torch.cuda.current_device()`` as the device of the tensors it creates for bookkeeping (the
model's RNG-tracker and dist-checkpointing helpers), and synchronises CUDA before saving. On a CPU that device is
"cpu" and there is nothing to synchronise. The math (layers, the dist checkpoint) runs unchanged; what this cannot
show is what CUDA itself does (streams, NCCL, bf16 kernels), nor Megatron's DDP and distributed optimizer (they
create ``device='cuda'`` tensors and check ``torch.cuda.*Tensor`` types): the lent GPU runs those.
"""
from __future__ import annotations


def install() -> None:
    import torch

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda: None
