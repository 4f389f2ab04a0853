"""Checks on a train parquet that are cheap enough for the preflight: how much of it repeats its own prompts.

The published DAPO-Math-17k parquet repeats each of its ~17.9k problems ~100 times (~1.79M rows): at batch 32 an
epoch is ~56k steps, so the length-aware sampler (which re-orders between epochs) and the cap never engage.
Only the prompt column is read (pyarrow, no pandas), and rows are compared inside Arrow: a prompt is the sequence
of its messages' (role, content), or the string itself for a plain-text prompt column.
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# Above this share of repeated rows the preflight warns (the file is mostly copies).
MAX_DUPLICATE_SHARE = 0.5


class DataCheckError(ValueError):
    """The file or its prompt column cannot be checked; the message names the file, the column and the fix."""


def duplicate_share(path: str | os.PathLike, prompt_key: str = "prompt") -> tuple[int, int, float]:
    """(rows, unique prompts, share of rows that repeat an earlier row's prompt) of a verl RL parquet.

    The prompt's text columns are read dictionary-encoded (the reader hashes each row group's strings into one
    dictionary), so rows are compared by integer index and the ~1 GB of text of a DAPO-sized file is never copied
    per row: ~2 s for 1.79M rows on 2 cores (``python bench/data_checks.py``).
    """
    try:
        schema = pq.read_schema(path)
        leaves = [c.path for c in pq.ParquetFile(path).schema]
    except (OSError, pa.ArrowInvalid) as e:
        raise DataCheckError(f"{path}: not a readable parquet file ({e})") from e
    if prompt_key not in schema.names:
        raise DataCheckError(
            f"{path}: no column '{prompt_key}' (PROMPT_KEY, data.prompt_key; columns: {', '.join(schema.names)}): "
            "export PROMPT_KEY=<the prompt column>, or convert the file with scripts/prepare_data.py"
        )
    kind = schema.field(prompt_key).type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        texts = [prompt_key]
    else:
        texts = [next((p for p in leaves if p.startswith(f"{prompt_key}.") and p.endswith(f".{f}")), None)
                 for f in ("role", "content")]
        if not _is_message_list(kind) or None in texts:
            raise DataCheckError(
                f"{path}: column '{prompt_key}' has type {kind}; expected a list of {{role, content}} messages "
                "(verl's RL format) or a string: convert the file with scripts/prepare_data.py"
            )
    column = pq.read_table(path, columns=[prompt_key], read_dictionary=texts).column(prompt_key)
    rows = len(column)
    if rows == 0:
        return 0, 0, 0.0
    keys = _indices(column) if texts == [prompt_key] else _message_list_keys(column)
    unique = pc.count_distinct(keys, mode="all").as_py()
    return rows, unique, 1.0 - unique / rows


def _is_message_list(kind: pa.DataType) -> bool:
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type):
        return False
    return {"role", "content"} <= {f.name for f in kind.value_type}


def _indices(dictionary_chunks: pa.ChunkedArray) -> pa.ChunkedArray:
    """Indices into one dictionary shared by every chunk (each parquet row group brings its own)."""
    unified = pa.table({"x": dictionary_chunks}).unify_dictionaries().column("x")
    return pa.chunked_array([c.indices for c in unified.chunks], type=pa.int32())


def _message_list_keys(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """One key per row, equal exactly when two rows hold the same (role, content) messages in the same order."""
    # A chunk may be a slice of a larger array: keep only the messages it references, offsets rebased to 0.
    offsets = [pc.subtract(c.offsets, c.offsets[0]) for c in column.chunks]
    values = [c.values.slice(c.offsets[0].as_py(), o[-1].as_py()) for c, o in zip(column.chunks, offsets)]
    fields = {}
    for name in ("role", "content"):
        idx = _indices(pa.chunked_array([v.field(name) for v in values], type=values[0].type.field(name).type))
        fields[name] = pc.add(pc.fill_null(idx.cast(pa.int64()), -1), 1)  # 0 = null
    n_content = (pc.max(fields["content"]).as_py() or 0) + 1  # None: no message at all
    message = pc.add(pc.multiply(fields["role"], n_content), fields["content"])
    if column.null_count == 0 and len(message) == len(column) and pc.min(pc.list_value_length(column)).as_py() == 1:
        return message  # one message per row (the common case): the message is the row's key
    message = message.cast(pa.string())
    rows, start = [], 0
    for chunk, o, v in zip(column.chunks, offsets, values):
        n = len(v)
        keys = pa.concat_arrays(message.slice(start, n).chunks) if n else pa.array([], pa.string())
        per_row = type(chunk).from_arrays(o, keys, mask=chunk.is_null())  # a null prompt stays null, not []
        rows.append(pc.binary_join(per_row, ","))
        start += n
    return pa.chunked_array(rows, type=pa.string())


def duplicate_warning(
    path: str | os.PathLike, prompt_key: str = "prompt", max_share: float = MAX_DUPLICATE_SHARE
) -> str | None:
    """The preflight's warning for a train file whose share of repeated prompts exceeds ``max_share`` (else None)."""
    rows, unique, share = duplicate_share(path, prompt_key)
    if share <= max_share:
        return None
    return (
        f"TRAIN_FILE {path}: {rows - unique:,} of {rows:,} rows ({share:.1%}) repeat an earlier prompt "
        f"({unique:,} unique): one epoch trains each problem ~{rows / unique:.0f} times, so the length-aware sampler "
        "(which re-orders between epochs) and the cap barely engage. Fix: "
        f"python scripts/prepare_data.py --dataset dapo-math-17k --input {path} --output TRAIN.parquet (drops repeated "
        "prompts by default; other sources: --dataset gsm8k|deepscaler), or de-duplicate the file by prompt yourself"
    )
