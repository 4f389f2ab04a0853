"""The train and validation parquet files: schema and row count, and how much of the train set repeats itself."""
from __future__ import annotations

import os
from collections.abc import Mapping

from ..settings import select


def check_data(cfg: Mapping, train_batch_size: int, errors: list[str], notes: list[str]) -> None:
    """Columns verl's dataset, reward loop and the recipe read (schema and row count), as the dataset fills them in
    from a user's columns (``PROMPT_KEY``, ``ANSWER_KEY``: recipe/user_data.py); for TRAIN_FILE also a note when it
    is mostly repeated prompts (only its prompt column is read, ~2 s for DAPO-Math-17k's 1.79M rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompt_key, answer_key = select(cfg, "data.prompt_key", "prompt"), select(cfg, "data.answer_key")
    for key, var in (("data.train_files", "TRAIN_FILE"), ("data.val_files", "TEST_FILE")):
        files = select(cfg, key)
        files = [files] if isinstance(files, str) else list(files or [])
        rows = 0
        for f in files:
            if not os.path.isfile(f):
                errors.append(f"{var}: {f} does not exist (`python scripts/prepare_data.py --help` writes verl's RL "
                              "parquet)")
                continue
            try:
                pf = pq.ParquetFile(f)
                schema = pf.schema_arrow
            except Exception as e:  # noqa: BLE001 - any unreadable file is a user error here
                errors.append(f"{var}: {f} is not a readable parquet file ({type(e).__name__}: {e})")
                continue
            rows += pf.metadata.num_rows
            columns = ", ".join(schema.names)
            if prompt_key not in schema.names:
                errors.append(f"{var}: {f} lacks column(s) ['{prompt_key}'] (PROMPT_KEY, the prompt column; it has "
                              f"{columns}): export PROMPT_KEY=<the column holding the prompt text or chat messages> "
                              "and ANSWER_KEY=<the answer column>, or convert it with scripts/prepare_data.py")
                continue
            kind = schema.field(prompt_key).type
            usable = _is_message_list(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            if not usable:
                errors.append(f"{var}: {f} column '{prompt_key}' (PROMPT_KEY) is {kind}, neither text nor a list of "
                              "{role, content} messages: name the prompt column in PROMPT_KEY")
            if answer_key and answer_key not in schema.names:
                errors.append(f"{var}: {f} has no answer column '{answer_key}' (ANSWER_KEY; columns: {columns}): "
                              "export ANSWER_KEY=<the column holding the reference answer>")
            elif not answer_key and "reward_model" not in schema.names:
                errors.append(f"{var}: {f} has no 'reward_model' column (columns: {columns}): export ANSWER_KEY=<the "
                              "column holding the reference answer> (the reward receives it as ground_truth)")
            elif not answer_key:
                rm = schema.field("reward_model").type
                if not (hasattr(rm, "get_field_index") and rm.get_field_index("ground_truth") >= 0):
                    errors.append(f"{var}: {f} column 'reward_model' has no 'ground_truth' field ({rm}): export "
                                  "ANSWER_KEY=<the column holding the reference answer>")
            if var == "TRAIN_FILE" and usable:
                _duplicates_note(f, prompt_key, errors, notes)
        if var == "TRAIN_FILE" and rows and rows < train_batch_size:
            errors.append(f"TRAIN_FILE holds {rows} rows, fewer than one batch (TRAIN_BATCH_SIZE={train_batch_size}): "
                          "the recipe cuts the train set to whole batches, so nothing would train; add data or lower "
                          "the batch")


def _duplicates_note(path: str, prompt_key: str, errors: list[str], notes: list[str]) -> None:
    """A note, not an error: a file of repeated prompts trains, but the sampler and the cap barely engage."""
    from ..data_checks import DataCheckError, duplicate_warning

    try:
        note = duplicate_warning(path, prompt_key)
    except DataCheckError as e:
        errors.append(f"TRAIN_FILE: {e}")
        return
    if note:
        notes.append(note)


def _is_message_list(t) -> bool:
    import pyarrow as pa

    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    return pa.types.is_struct(item) and item.get_field_index("role") >= 0 and item.get_field_index("content") >= 0
