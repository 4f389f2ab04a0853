"""A user's own parquet as verl's RL rows: the prompt and answer columns named by ``PROMPT_KEY`` / ``ANSWER_KEY``.

verl's ``RLHFDataset`` reads ``data.prompt_key`` as a list of chat messages (``{role, content}``) and applies the
tokenizer's chat template to them (its length filter here, the agent loop at rollout); its reward loop reads
``reward_model.ground_truth`` and ``data.reward_fn_key`` (``data_source``). A file of plain questions and answers
has none of that, so :func:`as_rl_rows` fills it in, in the dataset (train and validation alike), before verl's
length filter: a plain-text prompt becomes one user message (verl then applies the chat template as for any
row), the answer column becomes ``reward_model.ground_truth`` and a missing ``data_source`` becomes
:data:`USER_SOURCE`. A file already in verl's format passes unchanged.
"""
from __future__ import annotations

USER_SOURCE = "user"  # data_source of rows whose file has none (the reward function receives it)


class UserDataError(ValueError):
    """The file's columns do not fit ``PROMPT_KEY`` / ``ANSWER_KEY``; the message names the variable and the fix."""


def as_rl_rows(dataset, prompt_key: str, answer_key: str | None, source_key: str = "data_source"):
    """``dataset`` (a ``datasets.Dataset``) with a message-list prompt column, ``reward_model.ground_truth`` and
    ``source_key``; rows already in that form are returned as they are."""
    names = dataset.column_names
    if prompt_key not in names:
        raise UserDataError(f"PROMPT_KEY={prompt_key}: the data has no such column (columns: {', '.join(names)}); "
                            "export PROMPT_KEY=<the column holding the prompt text or chat messages>")
    if answer_key and answer_key not in names:
        raise UserDataError(f"ANSWER_KEY={answer_key}: the data has no such column (columns: {', '.join(names)}); "
                            "export ANSWER_KEY=<the column holding the reference answer>")
    if not answer_key and "reward_model" not in names:
        raise UserDataError(f"the data has no 'reward_model' column (columns: {', '.join(names)}): export "
                            "ANSWER_KEY=<the column holding the reference answer> (it becomes reward_model."
                            "ground_truth, what the reward function receives as ground_truth)")
    text_prompt = getattr(dataset.features[prompt_key], "dtype", None) in ("string", "large_string")
    add_source = source_key not in names
    if not (text_prompt or answer_key or add_source):
        return dataset

    def convert(row: dict) -> dict:
        out = {}
        if text_prompt:
            out[prompt_key] = [{"role": "user", "content": row[prompt_key]}]
        if answer_key:
            out["reward_model"] = {"style": "rule", "ground_truth": _answer_text(row[answer_key], answer_key)}
        if add_source:
            out[source_key] = USER_SOURCE
        return out

    return dataset.map(convert, desc="user data: prompt as messages, answer as ground truth")


def _answer_text(value, answer_key: str) -> str:
    """The reward receives ground truth as text, as verl's own datasets hold it (``42`` -> ``"42"``)."""
    if value is None or isinstance(value, (dict, list)):
        raise UserDataError(f"ANSWER_KEY={answer_key}: a row holds {value!r:.80}, not a plain answer (text or "
                            "number); name a column of answers")
    return str(value)
