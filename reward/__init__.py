"""Reward functions for verl's ``reward.custom_reward_function``."""

from .math_reward import compute_score

__all__ = ["compute_score"]
