"""The group corpus's byte bound as the launcher and the engines both read it (stdlib only: the preflight imports it
without numba)."""
CORPUS_GIB = "ROLLOUT_SPECULATIVE_CORPUS_GIB"  # per engine; recipe/preflight/knobs.py declares it
# the knob's default, which an engine also uses when the variable did not reach it: a whole epoch of history at the
# users' scale needs ~90 GiB at 224 B per token (recipe/sim/corpus_limits.py; 24 GiB keeps ~3% of it)
DEFAULT_CORPUS_GIB = 96.0
RAY_ENV_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{CORPUS_GIB}"  # where the launch's config carries it
