"""Rollout-phase simulator: replays response-length traces through the recipe's own policies and an engine model.

``trace`` (what the model would generate, generated or recorded; ``Trace.previous_run`` for warm starts),
``engine`` (how long a step takes on the rollout replicas, with vLLM's KV-cache admission and preemption),
``policies`` (batch formation from the same ``recipe.core`` objects the trainer drives, the tail cut
included), ``run`` (the driver and the per-policy summary) and ``__main__`` (the report:
``python -m recipe.sim --help``). numpy only; ``recipe.traces`` provides the recorded-trace format.
"""
