"""MoE router replay (``ROUTER_REPLAY``) on the composed config: what verl 0.9.1 and vLLM cannot serve, and the
routing data a configuration moves per step and holds across steps (``recipe/core/routing_cost.py``).

Each refusal is something verl or vLLM would otherwise meet only in a worker, minutes into the launch, or never
(a silently different replay). The keys are read from the composed config, so a user's own override is checked too.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..core.routing_cost import WARN_SHARE_OF_NODE_MEMORY, describe, fmt_bytes, routing_cost
from ..settings import select
from .batches import is_on
from .knobs import ARR, MEG
from .model import expert_count

ROLLOUT_KEY = f"{ARR}.rollout.enable_rollout_routing_replay"
MODE_KEY = f"{MEG}.router_replay.mode"
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")
VLLM_CAPTURE_FLOOR = (0, 22)  # verl/workers/rollout/vllm_rollout/vllm_async_server.py refuses R3 below it


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


def routing_cost_of(cfg: Mapping, hf: dict | None):
    """The routing data of the composed config (None: replay off, or the model's layers / top-k unknown)."""
    mode = replay_mode(cfg)
    top_k = next((hf[k] for k in TOP_K_KEYS if isinstance((hf or {}).get(k), int)), None)
    if mode == "disabled" or not hf or not expert_count(hf) or not top_k:
        return None
    os_ = select(cfg, "recipe.over_sample", {}) or {}
    over = is_on(os_.get("enable"))
    return routing_cost(mode, layers=hf["num_hidden_layers"], top_k=top_k, batch=select(cfg, "data.train_batch_size"),
                        n=select(cfg, f"{ARR}.rollout.n"), prompt_length=select(cfg, "data.max_prompt_length"),
                        response_length=select(cfg, "data.max_response_length"),
                        over_sample_ratio=float(os_.get("ratio") or 0) if over else 0.0,
                        continue_partial=over and os_.get("requeue") == "continue")


def routing_row(cfg: Mapping, hf: dict | None) -> str:
    """The summary table's line: the mode and, when on, what it moves and holds."""
    mode = replay_mode(cfg)
    if mode == "disabled":
        return "off (ROUTER_REPLAY=off)"
    cost = routing_cost_of(cfg, hf)
    return describe(cost) if cost else f"{mode} (the model's layers / top-k are unknown: no size estimate)"


def routing_memory_note(cfg: Mapping, hf: dict | None, notes: list[str], node_memory: int | None) -> None:
    """A warning when one step's routes (plus those kept across steps) exceed a share of a node's memory."""
    cost = routing_cost_of(cfg, hf)
    if cost is None or not node_memory or cost.total <= WARN_SHARE_OF_NODE_MEMORY * node_memory:
        return
    knobs = "MAX_RESPONSE_LENGTH, TRAIN_BATCH_SIZE, ROLLOUT_N, OVER_SAMPLE_RATIO" + (
        " / OVER_SAMPLE_REQUEUE=restart" if cost.held_across_steps else "")
    notes.append(f"ROUTER_REPLAY={cost.mode} moves up to {fmt_bytes(cost.per_step)} of routes per step"
                 + (f" and holds {fmt_bytes(cost.held_across_steps)} across steps" if cost.held_across_steps else "")
                 + f", more than {WARN_SHARE_OF_NODE_MEMORY:.0%} of this node's {fmt_bytes(node_memory)} of memory "
                 "(TransferQueue's storage and Ray's object store keep it in host memory); it is bounded by "
                 f"{knobs} (bytes = responses x (MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH) x layers x top-k x 2)")
