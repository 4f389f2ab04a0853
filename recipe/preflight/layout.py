"""Megatron's parallel layout against the GPU count and the model: the rules Megatron enforces only at start-up."""
from __future__ import annotations

import math
from collections.abc import Mapping

from ..settings import select
from .knobs import MEG
from .model import expert_count


def fsdp_layout(cfg: Mapping) -> dict:
    """The CPU preset's layout for the other checks and the summary: verl's FSDP engine, data parallel only."""
    world = select(cfg, "trainer.nnodes") * select(cfg, "trainer.n_gpus_per_node")
    return {"world": world, "dp": world, "etp": None, "edp": None, "split": [], "experts": None}


def check_parallel(cfg: Mapping, hf: dict | None, errors: list[str]) -> dict:
    """Megatron-Core 0.18's layout rules (``parallel_state.initialize_model_parallel``, core_v0.18.0 :736 and :789,
    ``TransformerConfig``; unchanged since 0.16).

    Two grids over the same GPUs: dense layers TP x CP x DP x PP = world, experts ETP x EP x EDP x PP = world
    (MoE parallel folding; ETP defaults to TP). So world % (TP x PP x CP) == 0 and EP x ETP divides world / PP;
    EP need not divide the dense DP, and CP does not constrain EP. Returns the layout for the summary.
    """
    g = lambda k: select(cfg, f"{MEG}.{k}")  # noqa: E731
    nnodes, per_node = select(cfg, "trainer.nnodes"), select(cfg, "trainer.n_gpus_per_node")
    world = nnodes * per_node
    tp, pp, cp, ep = (g("tensor_model_parallel_size"), g("pipeline_model_parallel_size"),
                      g("context_parallel_size"), g("expert_model_parallel_size"))
    etp = g("expert_tensor_parallel_size") or tp
    layout = {"world": world, "etp": etp, "split": [], "experts": None,
              "dp": None if world % (tp * pp * cp) else world // (tp * pp * cp),
              "edp": None if world % (etp * ep * pp) else world // (etp * ep * pp)}
    gpus = f"the {world} GPUs (NNODES={nnodes} x GPUS_PER_NODE={per_node})"
    if layout["dp"] is None:
        errors.append(f"ACTOR_TP={tp} x ACTOR_PP={pp} x ACTOR_CP={cp} = {tp * pp * cp} does not divide {gpus}: "
                      "Megatron needs world % (TP x PP x CP) == 0; change ACTOR_TP/ACTOR_PP/ACTOR_CP or the GPU count")
    if layout["edp"] is None:
        fits = [e for e in range(ep, 0, -1) if world % (etp * e * pp) == 0]
        fix = f"e.g. ACTOR_EP={fits[0]}, or a smaller ACTOR_PP" if fits else "lower ACTOR_ETP or ACTOR_PP"
        errors.append(f"ACTOR_EP={ep} x ACTOR_ETP={etp} x ACTOR_PP={pp} = {etp * ep * pp} does not divide {gpus}: "
                      f"Megatron's expert grid needs EP x ETP to divide world / PP = {world / pp:g}; {fix}")
    if ep > 1 and tp > 1 and not g("sequence_parallel"):
        errors.append(f"ACTOR_SEQUENCE_PARALLEL=0 with ACTOR_TP={tp} and ACTOR_EP={ep}: Megatron MoE needs "
                      "sequence parallelism with TP and EP; export ACTOR_SEQUENCE_PARALLEL=1")
    if hf is None:
        return layout
    experts = layout["experts"] = expert_count(hf)
    if experts is None and ep > 1:
        errors.append(f"ACTOR_EP={ep} but MODEL_PATH's config.json has no experts (dense model): export ACTOR_EP=1")
    elif experts is not None and experts % ep:
        divisors = [d for d in range(1, experts + 1) if experts % d == 0 and d <= world]
        errors.append(f"ACTOR_EP={ep} does not divide num_experts={experts} (MODEL_PATH config.json): each EP rank "
                      f"holds num_experts / EP experts; choose one of {divisors}")
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"]
    if heads % tp or kv % tp:
        errors.append(f"ACTOR_TP={tp} must divide num_attention_heads={heads} and num_key_value_heads={kv} "
                      f"(MODEL_PATH config.json); choose a divisor of {math.gcd(heads, kv)}")
    otc = g("override_transformer_config") or {}
    layout["split"] = _pipeline_split(hf["num_hidden_layers"], pp, otc.get("num_layers_in_first_pipeline_stage"),
                                      otc.get("num_layers_in_last_pipeline_stage"), errors)
    vpp = g("virtual_pipeline_model_parallel_size")
    if vpp and any(n % vpp for n in layout["split"]):
        errors.append(f"{MEG}.virtual_pipeline_model_parallel_size={vpp} must divide every stage's layer count "
                      f"{layout['split']}")
    return layout


def _pipeline_split(layers: int, pp: int, first: int | None, last: int | None, errors: list[str]) -> list[int]:
    """Layers per stage as Megatron assigns them (first/last fixed, the rest even over the middle), or []."""
    even = "ACTOR_PP_FIRST_LAYERS=0 ACTOR_PP_LAST_LAYERS=0"
    if pp == 1:
        if first or last:
            errors.append(f"ACTOR_PP_FIRST_LAYERS={first or 0} / ACTOR_PP_LAST_LAYERS={last or 0} with ACTOR_PP=1: "
                          f"uneven stages need pipeline parallelism; export {even}")
            return []
        return [layers]
    if first is None and last is None:
        if layers % pp:
            errors.append(f"ACTOR_PP={pp} does not divide num_hidden_layers={layers} for an even split: set "
                          "ACTOR_PP_FIRST_LAYERS / ACTOR_PP_LAST_LAYERS so that the middle stages share the rest "
                          "evenly")
            return []
        return [layers // pp] * pp
    middle_stages = pp - (first is not None) - (last is not None)
    middle_layers = layers - (first or 0) - (last or 0)
    if middle_layers < 0 or bool(middle_layers) != bool(middle_stages) or (
            middle_stages and middle_layers % middle_stages):
        hint = _uneven_hint(layers, pp)
        fix = (f"e.g. ACTOR_PP_FIRST_LAYERS={hint} ACTOR_PP_LAST_LAYERS={hint}" if hint else
               f"e.g. {even} for an even split" if layers % pp == 0 else
               "first + last + the middle stages' equal shares must make num_hidden_layers")
        given = f"ACTOR_PP_FIRST_LAYERS={first or 0} + ACTOR_PP_LAST_LAYERS={last or 0}"
        if middle_stages == 0:
            errors.append(f"{given} = {(first or 0) + (last or 0)} != num_hidden_layers={layers} with ACTOR_PP={pp} "
                          f"(no middle stages); {fix}")
        else:
            errors.append(f"{given} leave {middle_layers} of num_hidden_layers={layers} for {middle_stages} middle "
                          f"stage(s) (ACTOR_PP={pp}), which must split them evenly; {fix}")
        return []
    per = middle_layers // middle_stages if middle_stages else 0
    return ([first] if first is not None else []) + [per] * middle_stages + ([last] if last is not None else [])


def _uneven_hint(layers: int, pp: int) -> int | None:
    """A first/last stage size two layers lighter than the middle ones (embedding / logits), if that fits."""
    if pp < 3 or (layers + 4) % pp or (layers + 4) // pp <= 2:
        return None
    return (layers + 4) // pp - 2
