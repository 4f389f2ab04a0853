"""Group and history drafting for speculative decoding (``ROLLOUT_SPECULATIVE=group``).

* ``corpus``: pure Python, no vLLM: the responses an engine has produced, grouped by prompt, indexed by n-gram,
  and the draft for a request (the longest match of its context's end in its own context, its GRPO siblings'
  responses so far and the same prompt's earlier responses).
* ``kernels``: its numba-compiled kernels, compiled once per node (the cache's lock).
* ``bounds``: its byte bound's variable and default (stdlib only: the preflight reads them).
* ``live``: the bytes of the arrays reachable from a corpus (its leak test and bench).
* ``vllm_proposer``: vLLM's ``custom_class`` proposer over that corpus.
"""
