"""Real tools for multi-turn GRPO rollouts (verl 0.9.1 ships none): docs/tools.md.

- ``calculator``: exact arithmetic (a parser over ``Fraction``, never ``eval``) for GSM8K-style data.
- ``bwrap`` / ``fusion``: Python execution in a local bubblewrap sandbox or on a SandboxFusion server;
  ``limits`` and ``result`` name every limit and every failure; ``cgroup``: the run's own cgroup (limits summed
  over all its processes); ``seccomp``: the syscall filter bwrap installs; ``sandbox``: backend choice and the
  preflight's ``sandbox_self_check``.
- ``verl_tools``: the verl ``BaseTool`` classes (the only module here that imports verl); ``configs/``: their YAML.
"""
