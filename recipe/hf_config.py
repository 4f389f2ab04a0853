"""A Hugging Face ``config.json`` as the recipe reads it: the preflight's checks and the agent loops' route shapes."""
from __future__ import annotations


def text_config(hf: dict) -> dict:
    """A multimodal config's language-model part (``text_config``), else the config itself."""
    return hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf
