"""The CPU preset's reward: a smoke task, not math.

A tiny random model cannot learn arithmetic in minutes, so the CPU run on it (``PRESET=cpu CPU_MODEL=random``) trains on a dense signal it
can learn within a few dozen GRPO steps: the share of the response's characters that are digits (0..1). Every
response gets a graded score, so every group has non-zero advantages from the first step, and a rising score shows
that the policy gradient, the weight sync to vLLM and the rollout all work together. verl's custom reward signature;
importable without the recipe.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    if not solution_str:
        return 0.0
    return sum(c.isdigit() for c in solution_str) / len(solution_str)
