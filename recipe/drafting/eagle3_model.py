"""vLLM's EAGLE-3 Llama head (``Eagle3LlamaForCausalLM``, one decoder layer) as a trainable torch module whose
state dict is the checkpoint vLLM loads (``fc``, ``midlayer.*``, ``norm``; the target's embeddings and LM head are
lent by the target unless the checkpoint has its own). Assembled from transformers' Llama modules (what the
``speculators`` library builds its first layer from), so the recipe can train a head without that library, which
is not in the pinned stack (it pins ``datasets<=5.1.0``).

The layer reads ``[input_layernorm(embedding of token t+1), hidden_norm(fc(aux hidden states at t))]`` and attends
causally over the sequence; the output, normed, is what the LM head reads: the draft of token t+2.
"""
from __future__ import annotations


def head_config(target: dict, aux_layers) -> dict:
    """A one-layer head's ``config.json`` for a target's ``config.json`` (the target's width, full vocabulary)."""
    from transformers import LlamaConfig

    hidden = target["hidden_size"]
    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
        num_attention_heads=target["num_attention_heads"], num_key_value_heads=target["num_key_value_heads"],
        head_dim=target.get("head_dim") or hidden // target["num_attention_heads"], vocab_size=target["vocab_size"],
        max_position_embeddings=target["max_position_embeddings"], rms_norm_eps=target.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=False, dtype="float32",
    ).to_dict()
    return {**config, "architectures": ["LlamaForCausalLMEagle3"], "target_hidden_size": hidden,
            "draft_vocab_size": target["vocab_size"], "eagle_aux_hidden_state_layer_ids": list(aux_layers)}


def head_module(config: dict):
    """The head for ``config`` (a head's ``config.json``), randomly initialised."""
    import torch
    from torch import nn
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

    cfg = LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})
    cfg._attn_implementation = "sdpa"  # causal without a mask
    h = cfg.hidden_size
    n_aux = len(config.get("eagle_aux_hidden_state_layer_ids") or (0, 1, 2))
    target_h = config.get("target_hidden_size") or h

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = LlamaAttention(cfg, layer_idx=0)
            attn = self.self_attn
            for name, heads in (("q_proj", cfg.num_attention_heads), ("k_proj", cfg.num_key_value_heads),
                                ("v_proj", cfg.num_key_value_heads)):  # the first layer reads [embeds, hidden]
                setattr(attn, name, nn.Linear(2 * h, heads * attn.head_dim, bias=False))
            self.mlp = LlamaMLP(cfg)
            self.input_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
            self.hidden_norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
            self.post_attention_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(n_aux * target_h, h, bias=False)
            self.midlayer = Layer()
            self.norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
            self.rotary = LlamaRotaryEmbedding(cfg)

        def forward(self, aux: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor | None = None):
            """``aux`` (B, T, n_aux * H): the target's hidden states at t; ``embeds`` (B, T, H): token t+1's
            embedding; ``positions`` (B, T): t (default 0..T-1); returns the normed hidden state the LM head reads
            (vLLM's ``LlamaModel.forward`` of the head)."""
            layer = self.midlayer
            residual = self.fc(aux)
            x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(residual)], dim=-1)
            if positions is None:
                positions = torch.arange(aux.shape[1], device=aux.device).expand(aux.shape[0], -1)
            residual = residual + layer.self_attn(x, self.rotary(x, positions), None)[0]
            residual = residual + layer.mlp(layer.post_attention_layernorm(residual))
            return self.norm(residual)

    return Head()


def checkpoint_state(head) -> dict:
    """The head's checkpoint tensors (its state dict without the rotary tables vLLM rebuilds)."""
    return {k: v.detach().contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
