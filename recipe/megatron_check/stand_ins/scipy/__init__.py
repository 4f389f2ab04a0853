"""Import-time stand-in for SciPy (see recipe/megatron_check/imports.py): modelopt's NAS module imports
``scipy.interpolate`` at module level; the Megatron check runs no NAS. Calling anything raises."""
from recipe.megatron_check.stand_ins._inert import module_getattr

__getattr__ = module_getattr(__name__)
