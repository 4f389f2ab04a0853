"""Test and smoke-run support: tiny local artifacts (``tiny``) and an in-process vLLM CPU engine (``vllm_engine``).

Kept free of pytest so the 1-GPU smoke preset of the training script can reuse the builders. Import the submodules
directly; ``vllm_engine`` imports vLLM and verl, ``tiny`` imports nothing heavy until a builder runs.
"""
