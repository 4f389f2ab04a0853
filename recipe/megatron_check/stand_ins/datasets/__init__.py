"""Import-time stand-in for Hugging Face ``datasets`` (see recipe/megatron_check/imports.py): verl's checkpoint manager
imports verl.utils.dataset at module level; the Megatron check loads no dataset. Calling anything raises."""
from recipe.megatron_check.stand_ins._inert import module_getattr

__getattr__ = module_getattr(__name__)
