"""Import-time stand-in for ``scipy.interpolate`` (see the package's docstring)."""
from recipe.megatron_check.stand_ins._inert import module_getattr

__getattr__ = module_getattr(__name__)
