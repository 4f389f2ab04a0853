"""MoE router replay (``ROUTER_REPLAY``) on the composed config: what verl 0.9.1 and vLLM cannot serve, the routing
data a configuration moves per step as the rollout writes it and the trainer reads it, and what vLLM holds for it
per engine (``recipe/core/routing_cost.py``).

Each refusal is something verl or vLLM would otherwise meet only in a worker, minutes into the launch, or never
(a silently different replay). The keys are read from the composed config, so a user's own override is checked too.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping

from ..core.routing_cost import (DEVICE_ROUTE_BYTES, WARN_SHARE_OF_NODE_MEMORY, describe, fmt_bytes, routing_cost,
                                 vllm_buffer_bytes_per_kv_token)
from ..settings import select
from .batches import is_on
from .knobs import ARR, MEG
from .model import expert_count

ROLLOUT_KEY = f"{ARR}.rollout.enable_rollout_routing_replay"
MODE_KEY = f"{MEG}.router_replay.mode"
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")
VLLM_CAPTURE_FLOOR = (0, 22)  # verl/workers/rollout/vllm_rollout/vllm_async_server.py refuses R3 below it
# vLLM 0.24 captures routes in its router (router/base_router.py, BaseRouter._select_experts). A monolithic MoE kernel
# selects the experts inside itself and never calls it (runner/moe_runner.py, _apply_quant_method): for the
# unquantized (bf16) MoE that is FlashInfer's TRT-LLM kernel (experts/trtllm_bf16_moe.py, compute capability 10.x
# only), which the oracle ranks first on those GPUs (oracle/unquantized.py) unless the engine's moe_backend names
# another. Triton and FlashInfer CUTLASS are modular: the router selects, the capture sees it.
MOE_BACKEND_KEY = f"{ARR}.rollout.engine_kwargs.vllm.moe_backend"
MOE_BACKEND_FIX = f"+{MOE_BACKEND_KEY}=triton"
ROUTER_MOE_BACKENDS = ("triton", "flashinfer_cutlass")
IN_KERNEL_MOE_BACKEND = "flashinfer_trtllm"
IN_KERNEL_FAMILY = 10  # compute capability 10.x: Blackwell SM100 (B200, GB200, B300)
CAPABILITY_VAR = "RECIPE_GPU_CAPABILITY"  # the rollout GPUs' compute capability, declared where none is visible


def replay_mode(cfg: Mapping) -> str:
    """R2 | R3 | disabled (also for the CPU preset's FSDP config, which has no Megatron key)."""
    return str(select(cfg, MODE_KEY) or "disabled")


def check_router_replay(cfg: Mapping, hf: dict | None, errors: list[str], notes: list[str]) -> None:
    mode, rollout = replay_mode(cfg), is_on(select(cfg, ROLLOUT_KEY))
    megatron = select(cfg, f"{ARR}.actor.strategy") == "megatron"
    if rollout and mode != "R3":
        if not megatron:
            errors.append(f"{ROLLOUT_KEY}=True with verl's FSDP engine (PRESET=cpu): vLLM would record every token's "
                          "routes and nothing replays them (verl/workers/engine_workers.py reads router_replay only "
                          "for the megatron and veomni strategies); drop the override")
        elif mode == "R2":
            errors.append(f"{MODE_KEY}=R2 with {ROLLOUT_KEY}=True: Megatron records its own routes only when the batch "
                          "carries none (verl/workers/engine/megatron/transformer_impl.py, record_r2_routes), so it "
                          "would replay vLLM's routes: R3 under the name R2 (verl's legacy trainer refuses this pair, "
                          "ray_trainer.py). Set ROUTER_REPLAY=R2 or R3 and drop the override")
        else:
            errors.append(f"{ROLLOUT_KEY}=True with {MODE_KEY}=disabled: vLLM would record every token's routes and "
                          "Megatron never replays them; set ROUTER_REPLAY=R3 (both keys) or drop the override")
    if mode == "R3" and not rollout:
        errors.append(f"{MODE_KEY}=R3 with {ROLLOUT_KEY}=False: the first actor update would fail in Megatron "
                      "(\"router_replay REPLAY: micro_batch has no routed_experts\", transformer_impl.py): R3 replays "
                      "the routes vLLM records; set ROUTER_REPLAY=R3 (it sets both keys) and drop the override")
    if mode == "disabled":
        return
    if hf is not None and not expert_count(hf):
        errors.append(f"ROUTER_REPLAY={mode} but MODEL_PATH={select(cfg, f'{ARR}.model.path')} is not a "
                      "Mixture-of-Experts model (its config.json has no num_experts / num_local_experts / "
                      "n_routed_experts): there are no routes to replay; export ROUTER_REPLAY=off")
    if mode == "R3":
        _check_vllm_capture(cfg, errors)
        _check_moe_kernel(cfg, errors, notes)
    meg = select(cfg, MEG, {}) or {}
    if is_on(meg.get("pad_to_length")) and is_on(meg.get("use_remove_padding")):
        errors.append(f"{MEG}.pad_to_length=True with ROUTER_REPLAY={mode}: verl's Megatron engine raises "
                      "\"pad_to_length is not supported with router replay\" (transformer_impl.py); set "
                      "pad_to_length=False or ROUTER_REPLAY=off")
    if is_on(meg.get("dynamic_context_parallel")) and is_on(
            select(meg, "override_transformer_config.moe_router_fusion")):
        errors.append(f"{MEG}.dynamic_context_parallel=True with moe_router_fusion and ROUTER_REPLAY={mode}: verl's "
                      "dynamic CP raises \"Dynamic CP router replay requires moe_router_fusion=False\"; set "
                      f"{MEG}.override_transformer_config.moe_router_fusion=False")


def installed_vllm() -> str | None:
    """The vLLM version the launch's Python would import (vLLM's GPU or CPU build), None when absent."""
    from importlib import metadata

    from ..stack_versions import DISTRIBUTIONS

    for dist in DISTRIBUTIONS["vllm"]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _check_vllm_capture(cfg: Mapping, errors: list[str]) -> None:
    """What vLLM refuses with ``enable_return_routed_experts`` (vllm/config/vllm.py, verl's vllm_async_server.py)."""
    from packaging.version import InvalidVersion, Version

    version = installed_vllm()
    try:
        too_old = version is not None and Version(version).release < VLLM_CAPTURE_FLOOR
    except InvalidVersion:
        too_old = False
    if too_old:
        errors.append(f"ROUTER_REPLAY=R3 with vLLM {version}: verl's vLLM server refuses enable_rollout_routing_replay "
                      f"below vLLM {'.'.join(map(str, VLLM_CAPTURE_FLOOR))} (vllm_async_server.py: earlier releases "
                      "lack or mis-size the routed-experts capture); install the GPU stack's vLLM "
                      "(docs/install-gpu.md) or use ROUTER_REPLAY=R2")
    rollout = select(cfg, f"{ARR}.rollout", {}) or {}
    name = rollout.get("name")
    if name != "vllm":
        errors.append(f"ROUTER_REPLAY=R3 with {ARR}.rollout.name={name}: the recipe's rollout (agent loops, plugins, "
                      "checks) is vLLM's, which returns the routed experts (enable_return_routed_experts); set "
                      f"{ARR}.rollout.name=vllm or ROUTER_REPLAY=R2")
    pp = rollout.get("pipeline_model_parallel_size") or 1
    if pp > 1:
        errors.append(f"ROUTER_REPLAY=R3 with {ARR}.rollout.pipeline_model_parallel_size={pp}: vLLM refuses "
                      "--enable-return-routed-experts with pipeline parallelism (vllm/config/vllm.py); use "
                      "pipeline_model_parallel_size=1 (ROLLOUT_TP / ROLLOUT_DP) or ROUTER_REPLAY=R2")
    kv = select(rollout, "engine_kwargs.vllm.kv_transfer_config")
    if kv:
        errors.append(f"ROUTER_REPLAY=R3 with {ARR}.rollout.engine_kwargs.vllm.kv_transfer_config: vLLM refuses "
                      "--enable-return-routed-experts with KV connectors (vllm/config/vllm.py); drop it or use "
                      "ROUTER_REPLAY=R2")


def moe_backend(cfg: Mapping) -> str:
    """The rollout's vLLM MoE backend as vLLM reads it (``--moe-backend``, which wins over ``kernel_config``)."""
    engine = select(cfg, f"{ARR}.rollout.engine_kwargs.vllm", {}) or {}
    value = engine.get("moe_backend")
    if value is None:
        kernel = engine.get("kernel_config") or {}
        try:
            value = (json.loads(kernel) if isinstance(kernel, str) else kernel).get("moe_backend")
        except (ValueError, AttributeError):  # not a mapping: vLLM's own parser refuses it, by its name
            value = None
    return str(value or "auto").strip().lower().replace("-", "_")


def gpu_capabilities() -> list[str] | None:
    """Each GPU's compute capability on this node (nvidia-smi, no CUDA context), None where there is none to ask."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.split() or None


def rollout_capabilities(errors: list[str]) -> tuple[list[tuple[int, int]] | None, str]:
    """The rollout GPUs' compute capabilities and where they were read: ``RECIPE_GPU_CAPABILITY`` (a launcher without
    the rollout's GPUs declares them), else this node's GPUs; (None, "") when neither says."""
    declared = os.environ.get(CAPABILITY_VAR, "").strip()
    if declared:
        caps = _capabilities(declared.split(","))
        if caps is None:
            errors.append(f"{CAPABILITY_VAR}={declared!r} is not a compute capability: write it as nvidia-smi "
                          "--query-gpu=compute_cap prints it on a rollout node (9.0 for H100 / H200, 10.0 for B200), "
                          "comma-separated for several kinds")
        return caps, f"{CAPABILITY_VAR}={declared}"
    found = gpu_capabilities()
    caps = _capabilities(found) if found else None  # a driver too old for compute_cap prints [N/A]: unknown
    return caps, f"this node's GPUs (nvidia-smi: {', '.join(found)})" if caps else ""


def _capabilities(texts: list[str]) -> list[tuple[int, int]] | None:
    try:
        caps = [tuple(int(part) for part in text.strip().split(".")) for text in texts]
    except ValueError:
        return None
    return caps if all(len(cap) == 2 for cap in caps) else None


def _check_moe_kernel(cfg: Mapping, errors: list[str], notes: list[str]) -> None:
    """R3 refuses a MoE kernel that selects its experts without vLLM's router (``MOE_BACKEND_KEY``'s comment), here
    rather than minutes into the launch: its routes come back all zero, expert 0 for every token."""
    backend = moe_backend(cfg)
    skips = ("selects the experts inside the kernel and never calls vLLM's router, where the routed-experts capture "
             "lives (vLLM 0.24: fused_moe/router/base_router.py, runner/moe_runner.py): every route would come "
             "back as expert 0, and the engine refuses to start with it (recipe/cpu/vllm_plugin.py)")
    if backend == IN_KERNEL_MOE_BACKEND:
        errors.append(f"ROUTER_REPLAY=R3 with {MOE_BACKEND_KEY}={backend}: FlashInfer's TRT-LLM MoE kernel {skips}. "
                      f"Force a kernel that routes outside it: {MOE_BACKEND_FIX}, or ROUTER_REPLAY=R2")
        return
    if backend != "auto":  # the others vLLM either routes outside the kernel or refuses for a bf16 MoE itself
        return
    caps, source = rollout_capabilities(errors)
    if caps is None and not source:
        notes.append(f"R3's MoE kernel was NOT checked: no GPU is visible here and {CAPABILITY_VAR} is unset. On "
                     "Blackwell (compute capability 10.x) vLLM 0.24 picks FlashInfer's TRT-LLM MoE kernel, which "
                     f"{skips}: there set {MOE_BACKEND_FIX}; declare {CAPABILITY_VAR} (nvidia-smi "
                     "--query-gpu=compute_cap on a rollout node) to have it checked")
        return
    blackwell = sorted({f"{major}.{minor}" for major, minor in caps or () if major == IN_KERNEL_FAMILY})
    if blackwell:
        errors.append(f"ROUTER_REPLAY=R3 on compute capability {', '.join(blackwell)} (Blackwell, SM100; checked: "
                      f"{source}) with vLLM's MoE backend on auto ({MOE_BACKEND_KEY} unset): vLLM 0.24 picks "
                      "FlashInfer's TRT-LLM bf16 MoE kernel there (fused_moe/oracle/unquantized.py), which "
                      f"{skips}. Force a kernel that routes outside it: {MOE_BACKEND_FIX} (vLLM's --moe-backend; "
                      "there is no environment variable for it), or ROUTER_REPLAY=R2")


def _top_k(hf: dict | None) -> int | None:
    return next((hf[k] for k in TOP_K_KEYS if isinstance((hf or {}).get(k), int)), None)


def routing_cost_of(cfg: Mapping, hf: dict | None):
    """The routing data of the composed config (None: replay off, or the model's layers / top-k unknown)."""
    mode, top_k = replay_mode(cfg), _top_k(hf)
    if mode == "disabled" or not hf or not expert_count(hf) or not top_k:
        return None
    os_ = select(cfg, "recipe.over_sample", {}) or {}
    meg = select(cfg, MEG, {}) or {}
    return routing_cost(mode, layers=hf["num_hidden_layers"], top_k=top_k, batch=select(cfg, "data.train_batch_size"),
                        n=select(cfg, f"{ARR}.rollout.n"), prompt_length=select(cfg, "data.max_prompt_length"),
                        response_length=select(cfg, "data.max_response_length"),
                        over_sample_ratio=float(os_.get("ratio") or 0) if is_on(os_.get("enable")) else 0.0,
                        bypass_old_log_probs=is_on(select(cfg, "algorithm.rollout_correction.bypass_mode")),
                        # verl's need_reference_policy: the reference's pass fetches the batch, routes included
                        reference=is_on(select(cfg, "algorithm.use_kl_in_reward"))
                        or is_on(select(cfg, f"{ARR}.actor.use_kl_loss")),
                        model_parallel=(meg.get("tensor_model_parallel_size") or 1)
                        * (meg.get("pipeline_model_parallel_size") or 1) * (meg.get("context_parallel_size") or 1))


def gpu_memory_bytes() -> int | None:
    """The smallest GPU's memory on this node (nvidia-smi), None where there is none to ask."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return min(int(line) for line in out.split()) * 2**20  # MiB
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def vllm_routes_row(cfg: Mapping, hf: dict | None, gpu_memory: int | None) -> str | None:
    """R3's routes inside vLLM 0.24 (``recipe/core/routing_cost.py``): the scheduler's buffer, one row per KV-cache
    slot, sized at start-up in each engine core's host memory; bounded by the KV cache a ``gpu_memory`` GPU leaves
    (None: stated per KV-cache token); and each worker's capture buffers. None without R3 or the model's sizes."""
    top_k = _top_k(hf)
    if replay_mode(cfg) != "R3" or not hf or not expert_count(hf) or not top_k:
        return None
    r = lambda k: select(cfg, f"{ARR}.rollout.{k}")  # noqa: E731
    layers, per_slot = hf["num_hidden_layers"], vllm_buffer_bytes_per_kv_token(hf["num_hidden_layers"], top_k,
                                                                               expert_count(hf))
    heads = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    kv_per_token = layers * 2 * heads * head_dim * 2  # K and V in bf16
    gpus = r("tensor_model_parallel_size") * (r("pipeline_model_parallel_size") or 1)  # one engine core's GPUs
    engines = max(1, select(cfg, "trainer.n_gpus_per_node") // gpus)
    text = (f"vLLM's scheduler holds {per_slot} B of routes per KV-cache token ({per_slot / kv_per_token:.2%} of the "
            "KV cache's bytes, uint8 ids) in each engine core's host memory, allocated at start-up")
    if gpu_memory:
        bound = per_slot / kv_per_token * r("gpu_memory_utilization") * gpu_memory * gpus
        text += (f": at most {fmt_bytes(bound)} per engine, {fmt_bytes(bound * engines)} for the {engines} per node "
                 f"(the KV cache of {gpus} x {fmt_bytes(gpu_memory)} GPUs at gpu_memory_utilization "
                 f"{r('gpu_memory_utilization')}; vLLM logs the exact size: 'RoutedExpertsManager CPU buffer')")
    device = r("max_num_batched_tokens") * layers * top_k * DEVICE_ROUTE_BYTES
    return text + f"; each GPU worker {fmt_bytes(device)} of capture buffer (int32) and as much pinned host memory"


def routing_rows(cfg: Mapping, hf: dict | None, gpu_memory: int | None = None) -> list[tuple[str, str]]:
    """The summary table's lines: the mode and, when on, what it moves; with R3, what vLLM holds for it."""
    mode = replay_mode(cfg)
    if mode == "disabled":
        return [("router replay", "off (ROUTER_REPLAY=off)")]
    cost = routing_cost_of(cfg, hf)
    rows = [("router replay", describe(cost) if cost else
             f"{mode} (the model's layers / top-k are unknown: no size estimate)")]
    vllm = vllm_routes_row(cfg, hf, gpu_memory)
    return rows + ([("routes in vLLM", vllm)] if vllm else [])


def routing_memory_note(cfg: Mapping, hf: dict | None, notes: list[str], node_memory: int | None) -> None:
    """A warning when one step's routes exceed a share of a node's memory."""
    cost = routing_cost_of(cfg, hf)
    if cost is None or not node_memory or cost.per_step <= WARN_SHARE_OF_NODE_MEMORY * node_memory:
        return
    notes.append(f"ROUTER_REPLAY={cost.mode} moves up to {fmt_bytes(cost.per_step)} of routes per step, more than "
                 f"{WARN_SHARE_OF_NODE_MEMORY:.0%} of this node's {fmt_bytes(node_memory)} of memory (TransferQueue's "
                 "storage and Ray's object store keep it in host memory); it is bounded by MAX_RESPONSE_LENGTH, "
                 "TRAIN_BATCH_SIZE, ROLLOUT_N, OVER_SAMPLE_RATIO (bytes = responses x (MAX_PROMPT_LENGTH + "
                 "MAX_RESPONSE_LENGTH) x layers x top-k x 2)")
