"""Import-time stand-in for PuLP (see recipe/megatron_check/imports.py): modelopt imports it at module level for a
search the Megatron check never runs. Calling anything raises."""
from recipe.megatron_check.stand_ins._inert import module_getattr

__getattr__ = module_getattr(__name__)
