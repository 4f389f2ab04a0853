"""Real tools for multi-turn GRPO rollouts (verl 0.9.1 ships none): docs/tools.md.

- ``calculator``: exact arithmetic (a parser over ``Fraction``, never ``eval``) for GSM8K-style data.
- ``bwrap`` / ``landlock_sandbox`` / ``fusion``: Python execution in a local bubblewrap sandbox, a local Landlock
  sandbox (no namespaces: non-root Docker) or on a SandboxFusion server (``fusion_probe``: its isolation, probed);
  ``limits`` and ``result`` name every limit and every failure; ``cgroup``: the run's own cgroup (limits summed
  over all its processes); ``syscalls``/``seccomp``: the syscall allowlist and its compiled filter; ``supervise``:
  what the local sandboxes share; ``sandbox``: backend choice and the preflight's ``sandbox_self_check``.
- ``verl_tools``: the verl ``BaseTool`` classes (the only module here that imports verl); ``configs/``: their YAML.
"""
