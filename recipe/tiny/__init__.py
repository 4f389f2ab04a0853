"""The tiny local artifacts the CPU preset, the smoke preset and the checks build (no model hub here): a BPE tokenizer
with a Qwen chat template, a random tiny Qwen3-MoE and generated parquet (:mod:`.artifacts`), synthetic tasks
(:mod:`.tasks`) and the tiny model trained on them (:mod:`.sft`). Seeded, versioned and cached per machine."""
