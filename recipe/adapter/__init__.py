"""The recipe's hooks into verl 0.9.1's training loop (sampler, agent loops, trainer, router, ...); every hook used
here is pinned by tests/contract/."""
