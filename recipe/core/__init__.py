"""Pure decision logic (numpy only): length estimates, epoch ordering, response caps, over-sampling.

Nothing here imports verl, torch or ray, so the trainer adapter and the simulator share one implementation.
"""
