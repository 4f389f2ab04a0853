"""The model's ``config.json`` (MODEL_PATH): the values the layout and rollout checks read."""
from __future__ import annotations

import json
from pathlib import Path

from ..hf_config import text_config


def model_config(model_path: str, errors: list[str]) -> dict | None:
    cfg_file = Path(model_path) / "config.json"
    if not cfg_file.is_file():
        errors.append(f"MODEL_PATH={model_path} has no config.json: point MODEL_PATH at a Hugging Face model "
                      "directory (config.json, tokenizer files, *.safetensors)")
        return None
    try:
        hf = json.loads(cfg_file.read_text())
    except ValueError as e:
        errors.append(f"MODEL_PATH={model_path}: config.json is not valid JSON ({e})")
        return None
    if not any((Path(model_path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        errors.append(f"MODEL_PATH={model_path} has no tokenizer (tokenizer.json / tokenizer_config.json): verl "
                      "and vLLM load the tokenizer from MODEL_PATH")
    hf = text_config(hf)
    for key in ("num_hidden_layers", "num_attention_heads"):
        if not isinstance(hf.get(key), int):
            errors.append(f"MODEL_PATH={model_path}: config.json has no integer {key}")
            return None
    return hf


def expert_count(hf: dict) -> int | None:
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(hf.get(key), int) and hf[key] > 0:
            return hf[key]
    return None
