"""The preflight notes (never refuses) a train file that is mostly copies of its own prompts.

The published DAPO-Math-17k parquet repeats each problem ~100 times: one epoch then trains each problem ~100
times, and the length-aware sampler (re-orders between epochs) and the cap barely engage. The check is
``recipe.data_checks.duplicate_warning`` (threshold: more than half the rows repeat an earlier prompt), per file.
"""
import pyarrow as pa
import pyarrow.parquet as pq

from recipe.preflight import run_preflight


def repeated(src, dst, times):
    """``src``'s rows with every prompt made distinct (its own rows may repeat a prompt), written ``times`` over."""
    table = pq.read_table(src)
    prompt = table.schema.field("prompt").type
    distinct = pa.array([[{"role": "user", "content": f"problem {i}"}] for i in range(len(table))], type=prompt)
    table = table.set_column(table.schema.get_field_index("prompt"), "prompt", distinct)
    pq.write_table(pa.concat_tables([table] * times), dst)
    return dst


def duplicate_notes(report):
    return [n for n in report.notes if "repeat an earlier prompt" in n]


def test_a_mostly_duplicated_train_file_is_a_note_with_the_share_and_the_fix(env_30b, tiny_artifacts, tmp_path):
    dup = repeated(tiny_artifacts.train_parquet, tmp_path / "dup.parquet", 4)  # 96 unique prompts x 4
    report = run_preflight([], {**env_30b, "TRAIN_FILE": str(dup)})
    assert report.ok, report.errors
    (note,) = duplicate_notes(report)
    assert note.startswith(f"TRAIN_FILE {dup}: 288 of 384 rows (75.0%) repeat an earlier prompt (96 unique)")
    assert "~4 times" in note and "scripts/prepare_data.py" in note


def test_unique_train_files_and_duplicated_test_files_get_no_note(env_30b, tiny_artifacts, tmp_path):
    half = repeated(tiny_artifacts.train_parquet, tmp_path / "twice.parquet", 2)  # 50%: the threshold, not above it
    dup_test = repeated(tiny_artifacts.test_parquet, tmp_path / "test.parquet", 4)
    report = run_preflight([], {**env_30b, "TRAIN_FILE": f"{tiny_artifacts.train_parquet},{half}",
                                "TEST_FILE": str(dup_test)})
    assert report.ok, report.errors
    assert duplicate_notes(report) == []


def test_each_train_file_is_checked(env_30b, tiny_artifacts, tmp_path):
    dup = repeated(tiny_artifacts.train_parquet, tmp_path / "dup.parquet", 3)
    report = run_preflight([], {**env_30b, "TRAIN_FILE": f"{tiny_artifacts.train_parquet},{dup}"})
    assert report.ok, report.errors
    assert [n.split(":", 1)[0] for n in duplicate_notes(report)] == [f"TRAIN_FILE {dup}"]
