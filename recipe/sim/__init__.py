"""Rollout-phase simulator: replays response-length traces through the recipe's own policies and an engine model.

``trace`` (what the model would generate, generated or recorded; ``Trace.previous_run`` for warm starts),
``engine`` (how long a step takes on the rollout replicas, with vLLM's KV-cache admission and preemption),
``policies`` (batch formation from the same ``recipe.core`` objects the trainer drives, the tail cut
included), ``run`` (the driver and the per-policy summary), ``__main__`` (the report:
``python -m recipe.sim --help``), ``speculation`` (the cost of speculative decoding, on a measured acceptance curve),
``acceptance`` (tokens per target step of a drafter, measured exactly from recorded responses:
``python -m recipe.sim.acceptance``), ``draft_head`` (a learned EAGLE-3 drafter: its forwards, training, memory,
drift and depth schedule) and ``learned`` (the drafters side by side: ``python -m recipe.sim.learned``). numpy only;
``recipe.traces`` provides the recorded-trace format.
"""
