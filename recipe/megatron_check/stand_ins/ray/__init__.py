"""Import-time stand-in for Ray (see recipe/megatron_check/imports.py): verl's modules import ray at module level
(type hints such as ``ray.ObjectRef``, decorators); the Megatron check starts no Ray actor. Calling anything raises."""
from recipe.megatron_check.stand_ins._inert import module_getattr

__getattr__ = module_getattr(__name__)
