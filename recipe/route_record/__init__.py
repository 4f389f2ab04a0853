"""The recipe's single- and multi-turn paths (capped, cut, resumed, handed back, tool calls) run through its agent loops
on an in-process vLLM CPU engine, with each token's routed experts: what the R3 replay check reads
(``python -m recipe.route_record OUT_DIR``, :mod:`.record`), on the CPU (tests/megatron) and on a lent GPU
(``scripts/gpu_check.sh --device``). :mod:`.engine` is the engine, :mod:`.config` the tiny run's config and agent
loops, :mod:`.paths` the recorded paths."""
