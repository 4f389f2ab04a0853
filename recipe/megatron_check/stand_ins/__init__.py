"""Import-time stand-ins for packages the lent GPU cannot carry (recipe/megatron_check/imports.py)."""
