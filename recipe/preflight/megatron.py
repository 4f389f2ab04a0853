"""Checks of the Megatron actor that neither verl nor Megatron make before the GPUs are taken.

- Routing: Megatron-Bridge's Qwen3-MoE mapping always renormalises the top-k routing weights, while Hugging Face and
  vLLM follow ``norm_topk_prob`` (transformers' default: false). With ``false`` the trainer and the rollout route
  tokens differently: the logprobs the actor trains on are not those of the policy that sampled (found by
  ``python -m recipe.megatron_check``: mean KL 1.8e-4 on the tiny model, 2e-8 with ``true``).
- Attention: verl sets Megatron's ``attention_backend=flash``; with Transformer Engine that needs the flash-attn
  package, and without it the first forward fails ("No dot product attention backend is available").
- Resume layout: a resume that changes TP/PP/EP/CP cannot load a ``dp_reshardable`` optimizer checkpoint.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Mapping

QWEN3_MOE = ("qwen3_moe",)


def check_routing(hf: dict | None, values: dict, errors: list[str]) -> None:
    if not hf or hf.get("model_type") not in QWEN3_MOE or values["ALLOW_UNNORMALISED_ROUTING"]:
        return
    if hf.get("norm_topk_prob") is not True:
        errors.append(
            f"MODEL_PATH={values['MODEL_PATH']}: config.json has norm_topk_prob={hf.get('norm_topk_prob', 'unset')} "
            "(transformers' default is false): Megatron-Bridge always renormalises the top-k routing weights while "
            "vLLM follows the config, so the Megatron trainer and the vLLM rollout would route tokens differently. "
            "Qwen3-30B-A3B's config has true; set it in config.json if the model was trained that way, or "
            "ALLOW_UNNORMALISED_ROUTING=1 to accept the mismatch")


def check_attention_backend(env: Mapping[str, str], values: dict, errors: list[str]) -> None:
    """On a real GPU launch, ``ACTOR_ATTENTION_BACKEND=flash`` needs flash-attn in the launch's Python."""
    if (env.get("RECIPE_STACK_TARGET") or "cpu").strip() != "gpu" or values.get("ACTOR_ATTENTION_BACKEND") != "flash":
        return
    if importlib.util.find_spec("flash_attn") is None:
        errors.append("ACTOR_ATTENTION_BACKEND=flash but flash-attn is not installed in this Python: Transformer "
                      "Engine would find no attention backend at the first forward. Use ACTOR_ATTENTION_BACKEND=auto "
                      "(the default: TE's cuDNN fused attention) or install flash-attn (verl's image has it)")


_LAYOUT_KEYS = {"tensor_model_parallel_size": "ACTOR_TP", "pipeline_model_parallel_size": "ACTOR_PP",
                "expert_model_parallel_size": "ACTOR_EP", "expert_tensor_parallel_size": "ACTOR_ETP",
                "context_parallel_size": "ACTOR_CP"}


def check_resume_layout(cfg: Mapping, values: dict, errors: list[str]) -> None:
    """A resume (``SAVE_CKPT_ENABLE=1``, ``resume_mode=auto``) from a checkpoint saved at another TP/PP/EP/CP: verl
    saves the distributed optimizer ``dp_reshardable`` unless ``dist_ckpt_optim_fully_reshardable``, and such an
    optimizer checkpoint loads only at the layout it was saved at (the data-parallel size may change). The layout is
    read from the latest checkpoint's ``transformer_config.json`` (verl writes it with the ``extra`` contents)."""
    import json
    from pathlib import Path

    from ..settings import select
    from .knobs import MEG

    if not values["SAVE_CKPT_ENABLE"] or values["CKPT_OPTIM_FULLY_RESHARDABLE"]:
        return
    run_dir = Path(str(select(cfg, "trainer.default_local_dir")))
    try:
        step = int((run_dir / "latest_checkpointed_iteration.txt").read_text().strip())
        saved = json.loads((run_dir / f"global_step_{step}" / "actor" / "transformer_config.json").read_text())
    except (OSError, ValueError):
        return  # no checkpoint to resume from (or none that records its layout)
    changed = [f"{env}: saved {saved[key]}, now {select(cfg, f'{MEG}.{key}')}" for key, env in _LAYOUT_KEYS.items()
               if key in saved and saved[key] is not None and saved[key] != select(cfg, f"{MEG}.{key}")]
    if changed:
        errors.append(
            f"SAVE_CKPT_ENABLE=1 resumes from {run_dir}/global_step_{step}, saved at another Megatron layout "
            f"({'; '.join(changed)}): its optimizer state was saved dp_reshardable and loads only at that layout. "
            "Keep the saved ACTOR_TP/PP/EP/ETP/CP for this run (set CKPT_OPTIM_FULLY_RESHARDABLE=1 there to change "
            "them at the next resume), or start a new run (another EXPERIMENT_NAME)")
