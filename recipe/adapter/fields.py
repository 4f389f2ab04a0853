"""Names of the per-row fields the recipe adds to verl batches.

They travel with each prompt from the driver through the agent-loop worker (as ``run()`` keyword arguments) into
the trajectory records in TransferQueue, where the trainer reads them back after the step. ``ROW_ID`` comes from the
dataset; the others are added to training rows in ``LengthAwareTrainer._next_train_batch``, where validation rows
never pass: they carry no cap, seed, partial rollout or rollout step.
"""
ROW_ID = "dataset_item_idx"  # the dataset row, stable across epochs and resume (verl's ``index`` is not)
CAP = "response_max_tokens_cap"  # vLLM max_tokens for this row's responses; 0 = no cap
PREDICTION = "length_prediction"  # the row's length estimate when its batch was formed; NaN = none
PARTIAL = "partial_rollout"  # JSON: where a re-queued row's partial responses wait in TransferQueue ("" = none)
SEED = "sampling_seed"  # per-row base of vLLM's per-request sampling seed (recipe.sampling_seed); -1 = engine RNG
ROLLOUT_STEP = "rollout_step"  # the training step the row was launched for: the rollout gate cuts only its own step
PRIORITY = "priority"  # vLLM request priority (lower first): verl's SingleTurnAgentLoop.run takes it as a kwarg
