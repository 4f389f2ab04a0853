"""recipe.data_checks: the duplicate-prompt share of a train parquet, against a plain-Python count of the same rows."""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe.data_checks import MAX_DUPLICATE_SHARE, DataCheckError, duplicate_share, duplicate_warning

MESSAGES = pa.list_(pa.struct({"role": pa.string(), "content": pa.string()}))
TEMPLATE = "Solve the following math problem step by step.\n\n{}\n\nRemember to put your answer after \"Answer:\"."


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def write(path, prompts, row_group_size=None, **columns) -> str:
    table = pa.table({"prompt": prompts, **columns})
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def reference(prompts) -> tuple[int, int, float]:
    keys = {None if p is None else (p if isinstance(p, str) else tuple((m["role"], m["content"]) for m in p))
            for p in prompts}
    return len(prompts), len(keys), 1 - len(keys) / len(prompts)


def test_dapo_like_file_with_repeats_across_row_groups(tmp_path):
    problems = [TEMPLATE.format(f"Find the number of divisors of {n}.") for n in range(50)]
    prompts = [user(problems[i % 50]) for i in range(50 * 20)]
    random.Random(0).shuffle(prompts)
    path = write(tmp_path / "dapo.parquet", prompts, row_group_size=64,  # 16 row groups, a dictionary each
                 reward_model=[{"ground_truth": "1"}] * len(prompts))
    assert pq.ParquetFile(path).metadata.num_row_groups == 16
    assert duplicate_share(path) == (1000, 50, pytest.approx(0.95))


@pytest.mark.parametrize("mixed", [False, True])
def test_large_row_group_read_back_as_sliced_chunks(tmp_path, mixed):
    """A row group above the reader's 128Ki-row batches comes back as slices of one array: offsets do not start at 0."""
    n = 140_000  # one row group, read back as a 131072-row slice and the rest
    lengths = np.where(np.arange(n) % 3 == 0, 2, 1) if mixed else np.ones(n, int)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    pool = pa.array([{"role": r, "content": f"q{i}"} for i in range(7) for r in ("user", "system")])
    message = np.arange(offsets[-1].as_py()) * 5 % 14  # which pool entry each message is
    path = write(tmp_path / "big.parquet", pa.ListArray.from_arrays(offsets, pool.take(pa.array(message))))
    assert [c.offset for c in pq.read_table(path).column("prompt").chunks][1] > 0
    o = offsets.to_numpy()
    unique = len({tuple(message[a:b]) for a, b in zip(o[:-1].tolist(), o[1:].tolist())})
    assert duplicate_share(path) == (n, unique, pytest.approx(1 - unique / n))


def test_what_makes_two_prompts_the_same(tmp_path):
    system = {"role": "system", "content": "You are a helpful assistant."}
    prompts = [
        user("a"), user("a"),  # the same
        [{"role": "system", "content": "a"}],  # same text, another role
        [system, *user("a")], [system, *user("a")], [*user("a"), system],  # order matters
        user("a,1"), [{"role": "user", "content": "a"}, {"role": "user", "content": "1"}],  # no join ambiguity
        [], [], None,  # an empty prompt and a null one are not errors
    ]
    path = write(tmp_path / "chat.parquet", prompts)
    assert duplicate_share(path) == reference(prompts) == (11, 8, pytest.approx(3 / 11))


def test_one_message_per_row_still_compares_the_role(tmp_path):
    prompts = [user("a"), [{"role": "system", "content": "a"}], user("a"), user("b")]  # the one-message fast path
    assert duplicate_share(write(tmp_path / "one.parquet", prompts, row_group_size=2)) == (4, 3, pytest.approx(0.25))


def test_plain_string_prompts_and_another_prompt_key(tmp_path):
    prompts = ["x", "y", "x", "x", None]
    path = write(tmp_path / "s.parquet", [user("unused")] * 5, question=prompts)
    assert duplicate_share(path, "question") == (5, 3, pytest.approx(0.4))


def test_file_written_by_pandas_like_prepare_data(tmp_path):
    rows = [{"data_source": "d", "prompt": user(f"q{i % 3}"), "extra_info": {"index": i}} for i in range(9)]
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet", index=False)
    assert duplicate_share(tmp_path / "p.parquet") == (9, 3, pytest.approx(2 / 3))


def test_empty_file(tmp_path):
    path = write(tmp_path / "e.parquet", pa.array([], MESSAGES))
    assert duplicate_share(path) == (0, 0, 0.0)


messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                           "content": st.sampled_from(["a", "b", "a,b", ""])}), max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(messages | st.none(), min_size=1, max_size=30), row_group_size=st.integers(1, 8))
def test_matches_a_python_count(tmp_path, prompts, row_group_size):
    path = write(tmp_path / "h.parquet", pa.array(prompts, MESSAGES), row_group_size=row_group_size)
    assert duplicate_share(path) == pytest.approx(reference(prompts))


def test_warning_names_share_and_fix(tmp_path):
    mostly = write(tmp_path / "dup.parquet", [user(f"q{i % 10}") for i in range(100)])
    message = duplicate_warning(mostly)
    assert message.startswith(f"TRAIN_FILE {mostly}: 90 of 100 rows (90.0%) repeat an earlier prompt (10 unique)")
    assert "each problem ~10 times" in message
    assert f"python scripts/prepare_data.py --dataset dapo-math-17k --input {mostly}" in message
    half = write(tmp_path / "half.parquet", [user(f"q{i % 50}") for i in range(100)])
    assert duplicate_share(half)[2] == MAX_DUPLICATE_SHARE and duplicate_warning(half) is None


@pytest.mark.parametrize(
    "make, key, message",
    [
        (lambda p: p, "prompt", "not a readable parquet file"),
        (lambda p: (p.write_text("not parquet"), p)[1], "prompt", "not a readable parquet file"),
        (lambda p: write(p, [user("a")]), "question",
         "no column 'question' (PROMPT_KEY, data.prompt_key; columns: prompt): export PROMPT_KEY="),
        (lambda p: write(p, [[1, 2]]), "prompt",
         "column 'prompt' has type list<element: int64>; expected a list of {role, content} messages"),
        (lambda p: write(p, [[{"text": "a"}]]), "prompt", "expected a list of {role, content} messages"),
    ],
)
def test_errors_name_the_file_and_the_fix(tmp_path, make, key, message):
    path = make(tmp_path / "bad.parquet")
    with pytest.raises(DataCheckError, match="scripts/prepare_data.py|not a readable") as e:
        duplicate_share(path, key)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)
