"""The recipe's Megatron path without Transformer Engine: on this CPU in the tests, on one GPU on a lent device.

``python -m recipe.megatron_check`` takes the tiny Qwen3-MoE through what ``scripts/convert_hf_to_distcp.sh`` and the
actor's load do on a cluster, each step a PASS/FAIL row (:mod:`.steps`):

- Megatron-Bridge builds the GPTModel from ``config.json`` (Megatron-Core's local layer spec), loads the Hugging Face
  weights, and its logits match Hugging Face within :func:`recipe.gpu_check.logits_verdict`'s limits;
- verl 0.9.1's converter mapping (``converter_hf_to_mcore.py``) into a fresh model equals the bridge's, tensor for
  tensor;
- the converter's ``dist_checkpointing.save`` passes the preflight's checkpoint check and loads back through verl's
  ``load_mcore_dist_weights`` with bitwise identical logits;
- a few training steps; on a GPU with Megatron's DDP and distributed optimizer, then verl's
  ``MegatronCheckpointManager`` save -> load into a fresh model and optimizer -> the identical next-step loss;
- ``reshard-save`` (under torchrun, 2 ranks): checkpoints saved at TP 2 and at EP 2, loaded by the single-rank run.

What it cannot prove (docs/testing.md): Transformer Engine's layer spec (its checkpoints carry ``_extra_state`` and a
fused ``pre_mlp_layernorm``), resharding at the real sizes, the vLLM weight sync.
"""
