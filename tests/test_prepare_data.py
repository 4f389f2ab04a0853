"""scripts/prepare_data.py on small files shaped like each published dataset, run as the CLI it is."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.script_module import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "prepare_data.py"

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

GSM8K = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
        "How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nShe earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    },
    {"question": "A farm has 1,200 hens and buys 300 more. How many hens?", "answer": "1200+300=1500\n#### 1,500"},
    {"question": "What is 3 + 4?", "answer": "3 + 4 = 7\n#### 7"},
]
DAPO_PROBLEMS = [
    ("In triangle $ABC$, $AB = 13$, $BC = 14$, $CA = 15$. Find the area of the triangle.", "84"),
    ("Find the number of positive divisors of $2024$.", "12"),
    ("Let $x$ satisfy $x^2 - 5x + 6 = 0$ with $x > 2$. Find $x$.", "3"),
]
DAPO = [
    {
        "data_source": "math_dapo",
        "prompt": [{"content": DAPO_PREFIX + problem + DAPO_SUFFIX, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": f"9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079-{i}"},
    }
    for i, (problem, answer) in enumerate(DAPO_PROBLEMS * 2)  # the published file repeats its problems
]
DEEPSCALER = [
    {
        "problem": "Let $a$ and $b$ be positive reals with $a + b = 1$. "
        "Find the minimum of $\\frac{1}{a} + \\frac{4}{b}$.",
        "answer": "9",
        "solution": "By Cauchy-Schwarz, $(a+b)(1/a+4/b) \\ge (1+2)^2 = 9$, so the minimum is $\\boxed{9}$.",
    },
    {
        "problem": "Compute $\\sin 30^\\circ$.",
        "answer": "\\frac{1}{2}",
        "solution": "From the 30-60-90 triangle, $\\sin 30^\\circ = \\boxed{\\frac{1}{2}}$.",
    },
]

# The two published AIME 2024 layouts: HuggingFaceH4/aime_2024 (answers as strings) and Maxwell-Jia/AIME_2024
# (capitalised columns, integer answers)
AIME_PROBLEMS = [
    ("Every morning Aya goes for a $9$-kilometer-long walk ... Find the number of minutes the walk takes her.", 204,
     "$s = 3$, so the walk takes $204$ minutes."),
    ("Let $ABC$ be a triangle inscribed in circle $\\omega$ ... Find $m + n$.", 113, "Power of a point gives $113$."),
    ("Find the largest possible real part of $(75+117i)z+\\frac{96+144i}{z}$ where $|z|=4$.", 540, "It is $540$."),
]
AIME_H4 = [{"id": 60 + i, "problem": p, "solution": sol, "answer": str(a), "url": "https://artofproblemsolving.com",
            "year": "2024"} for i, (p, a, sol) in enumerate(AIME_PROBLEMS)]
AIME_MAXWELL = [{"ID": f"2024-I-{i + 1}", "Problem": p, "Solution": sol, "Answer": a}
                for i, (p, a, sol) in enumerate(AIME_PROBLEMS)]


def write(path: Path, records: list[dict]) -> Path:
    if path.suffix == ".parquet":
        pd.DataFrame(records).to_parquet(path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records))
    return path


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60
    )


def run_in_process(capsys, *args) -> tuple[int, str]:
    """Error paths run in-process (no interpreter + pandas start per case); returns (exit code, stderr)."""
    module = load_script(SCRIPT)
    try:
        code = module.main([str(a) for a in args])
    except SystemExit as e:  # argparse errors
        code = e.code
    return code, capsys.readouterr().err


def check_verl_rows(df: pd.DataFrame, split: str) -> None:
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for i, row in enumerate(df.itertuples()):
        assert isinstance(row.data_source, str)
        prompt = list(row.prompt)  # pandas reads list<struct> back as a numpy array of dicts
        assert len(prompt) == 1 and isinstance(prompt[0], dict)
        assert prompt[0]["role"] == "user"
        assert "step by step" in prompt[0]["content"] and "\\boxed{}" in prompt[0]["content"]
        assert row.ability == "math"
        assert row.reward_model["style"] == "rule"
        assert isinstance(row.reward_model["ground_truth"], str) and row.reward_model["ground_truth"]
        assert row.extra_info["index"] == i
        assert row.extra_info["split"] == split


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_gsm8k(tmp_path, suffix):
    src = write(tmp_path / f"gsm8k{suffix}", GSM8K)
    out = tmp_path / "train.parquet"
    res = run("--dataset", "gsm8k", "--input", src, "--output", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"gsm8k: rows in 4, rows out 4 -> {out}; dropped 0 rows repeating an earlier prompt"
    df = pd.read_parquet(out)
    check_verl_rows(df, "train")
    assert df["reward_model"].map(lambda r: r["ground_truth"]).tolist() == ["72", "10", "1500", "7"]
    assert df["data_source"].eq("openai/gsm8k").all()
    first = df.iloc[0]
    assert first["prompt"][0]["content"].startswith(GSM8K[0]["question"] + "\n\n")
    assert first["extra_info"]["question"] == GSM8K[0]["question"]
    assert first["extra_info"]["answer"] == GSM8K[0]["answer"]


def test_dapo_parquet_rewraps_prompt_and_keeps_uuid(tmp_path):
    src = write(tmp_path / "dapo-math-17k.parquet", DAPO)
    out = tmp_path / "train.parquet"
    res = run("--dataset", "dapo-math-17k", "--input", src, "--output", out)
    assert res.returncode == 0, res.stderr
    df = pd.read_parquet(out)
    check_verl_rows(df, "train")
    assert len(df) == 3  # the repeats are dropped by default
    content = df.iloc[0]["prompt"][0]["content"]
    assert content.startswith(DAPO_PROBLEMS[0][0] + "\n\n")
    assert "Answer: $Answer" not in content and "Remember to put" not in content
    assert df.iloc[0]["extra_info"]["source_id"] == DAPO[0]["extra_info"]["index"]
    assert df.iloc[0]["extra_info"]["question"] == DAPO_PROBLEMS[0][0]
    assert df.iloc[1]["reward_model"]["ground_truth"] == "12"


def test_dapo_duplicates_dropped_by_default_and_reported(tmp_path):
    src = write(tmp_path / "dapo.jsonl", DAPO)
    out = tmp_path / "train.parquet"
    res = run("--dataset", "dapo-math-17k", "--input", src, "--output", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        f"dapo-math-17k: rows in 6, rows out 3 -> {out}; dropped 3 rows repeating an earlier prompt"
    )
    df = pd.read_parquet(out)
    check_verl_rows(df, "train")
    # The first occurrence of each prompt is the one kept.
    assert [e["source_id"] for e in df["extra_info"]] == [d["extra_info"]["index"] for d in DAPO[:3]]


def test_keep_duplicates(tmp_path):
    src = write(tmp_path / "dapo.jsonl", DAPO)
    out = tmp_path / "train.parquet"
    res = run("--dataset", "dapo-math-17k", "--input", src, "--output", out, "--keep-duplicates")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("rows out 6 -> " + str(out) + "; duplicate prompts kept (--keep-duplicates)")
    df = pd.read_parquet(out)
    assert [e["source_id"] for e in df["extra_info"]] == [d["extra_info"]["index"] for d in DAPO]


def test_duplicate_prompt_with_another_answer_keeps_the_first_and_says_so(tmp_path):
    # Same problem text (the template and surrounding whitespace aside), a different ground truth.
    other = dict(DAPO[1], reward_model={"ground_truth": "13", "style": "rule"})
    other["prompt"] = [{"role": "user", "content": DAPO_PREFIX + "  " + DAPO_PROBLEMS[1][0] + DAPO_SUFFIX}]
    src = write(tmp_path / "dapo.jsonl", [DAPO[0], DAPO[1], other, DAPO[4]])
    out = tmp_path / "train.parquet"
    res = run("--dataset", "dapo-math-17k", "--input", src, "--output", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith(
        "dropped 2 rows repeating an earlier prompt (1 of them with a different ground truth: the first row's was kept)"
    )
    assert pd.read_parquet(out)["reward_model"].map(lambda r: r["ground_truth"]).tolist() == ["84", "12"]


def test_held_out_rows_share_no_prompt_with_training(tmp_path):
    src = write(tmp_path / "dapo.parquet", DAPO * 3)  # 18 rows, 3 prompts
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    res = run("--dataset", "dapo-math-17k", "--input", src, "--output", train, "--split-test", 1, "--test-output", test)
    assert res.returncode == 0, res.stderr
    prompts = [set(pd.read_parquet(f)["extra_info"].map(lambda e: e["question"])) for f in (train, test)]
    assert len(prompts[0]) == 2 and len(prompts[1]) == 1 and not prompts[0] & prompts[1]


def test_deepscaler_json_with_test_split_and_limit(tmp_path):
    variants = [dict(d, problem=f"{d['problem']} (variant {i})") for i in range(5) for d in DEEPSCALER]
    src = write(tmp_path / "deepscaler.json", variants)
    train, test = tmp_path / "out" / "train.parquet", tmp_path / "out" / "test.parquet"
    res = run(
        "--dataset", "deepscaler", "--input", src, "--output", train,
        "--split-test", 3, "--test-output", test, "--limit", 8,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        f"deepscaler: rows in 8 (first 8 of 10), rows out 5 -> {train} + 3 -> {test}; "
        "dropped 0 rows repeating an earlier prompt"
    )
    train_df, test_df = pd.read_parquet(train), pd.read_parquet(test)
    check_verl_rows(train_df, "train")
    check_verl_rows(test_df, "test")
    assert set(train_df["reward_model"].map(lambda r: r["ground_truth"])) <= {"9", "\\frac{1}{2}"}
    assert test_df.iloc[0]["extra_info"]["solution"] in {d["solution"] for d in DEEPSCALER}


@pytest.mark.parametrize("records,source_ids", [(AIME_H4, ["60", "61", "62"]),
                                                (AIME_MAXWELL, ["2024-I-1", "2024-I-2", "2024-I-3"])])
def test_aime24_from_either_published_layout_is_a_test_file_the_reward_scores(tmp_path, records, source_ids):
    """The quick start's TEST_FILE: a locally built parquet in each published layout converts to verl's rows, and the
    default reward gives 1 to a response boxing the answer and 0 to one boxing another."""
    from reward.math_reward import compute_score

    src = write(tmp_path / "aime_2024.parquet", records)
    out = tmp_path / "aime24.parquet"
    res = run("--dataset", "aime24", "--input", src, "--output", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"aime24: rows in 3, rows out 3 -> {out}; dropped 0 rows repeating an earlier prompt"
    df = pd.read_parquet(out)
    check_verl_rows(df, "train")
    assert df["data_source"].eq("aime24").all()
    truths = df["reward_model"].map(lambda r: r["ground_truth"]).tolist()
    assert truths == ["204", "113", "540"]
    assert [e["source_id"] for e in df["extra_info"]] == source_ids
    assert df.iloc[0]["extra_info"]["solution"] == AIME_PROBLEMS[0][2]
    assert df.iloc[0]["prompt"][0]["content"].startswith(AIME_PROBLEMS[0][0] + "\n\n")
    for truth in truths:
        assert compute_score("aime24", f"So the answer is \\boxed{{{truth}}}.", truth) == 1.0
        assert compute_score("aime24", "So the answer is \\boxed{7}.", truth) == 0.0


def test_aime24_without_an_answer_column_names_what_it_found(tmp_path, capsys):
    src = write(tmp_path / "aime.jsonl", [{"Problem": "p", "Solution": "s"}])
    code, err = run_in_process(capsys, "--dataset", "aime24", "--input", src, "--output", tmp_path / "o.parquet")
    assert code == 1 and "missing column 'answer' (any case; columns present: ['Problem', 'Solution'])" in err
    assert not (tmp_path / "o.parquet").exists()

def test_json_lines_in_a_dot_json_file(tmp_path):
    src = tmp_path / "deepscaler.json"  # what datasets' to_json writes
    write(tmp_path / "x.jsonl", DEEPSCALER).rename(src)
    res = run("--dataset", "deepscaler", "--input", src, "--output", tmp_path / "o.parquet")
    assert res.returncode == 0, res.stderr
    assert len(pd.read_parquet(tmp_path / "o.parquet")) == 2


def test_wrong_shape_names_missing_column_and_file(tmp_path):
    src = write(tmp_path / "gsm8k.jsonl", GSM8K)
    res = run("--dataset", "deepscaler", "--input", src, "--output", tmp_path / "o.parquet")
    assert res.returncode == 1
    assert "missing column 'problem'" in res.stderr and str(src) in res.stderr and "row 0" in res.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_gsm8k_file_as_dapo_names_missing_column(tmp_path, capsys):
    src = write(tmp_path / "gsm8k.jsonl", GSM8K)
    code, err = run_in_process(capsys, "--dataset", "dapo-math-17k", "--input", src, "--output", tmp_path / "o.parquet")
    assert code == 1 and "missing column 'prompt'" in err and str(src) in err


def test_dapo_prompt_without_dapo_template_is_rejected(tmp_path, capsys):
    bad = [dict(DAPO[0], prompt=[{"role": "user", "content": "What is 2 + 2?"}])]
    src = write(tmp_path / "dapo.jsonl", bad)
    code, err = run_in_process(capsys, "--dataset", "dapo-math-17k", "--input", src, "--output", tmp_path / "o.parquet")
    assert code == 1 and "DAPO-Math-17k's 'Solve the following ...' template" in err


def test_gsm8k_answer_without_final_line_is_rejected(tmp_path, capsys):
    src = write(tmp_path / "gsm8k.jsonl", [GSM8K[0], {"question": "q", "answer": "no final line"}])
    code, err = run_in_process(capsys, "--dataset", "gsm8k", "--input", src, "--output", tmp_path / "o.parquet")
    assert code == 1 and "row 1" in err and "'#### <number>'" in err


def test_refuses_to_overwrite_without_flag(tmp_path, capsys):
    src = write(tmp_path / "gsm8k.jsonl", GSM8K)
    out = tmp_path / "train.parquet"
    out.write_bytes(b"keep me")
    code, err = run_in_process(capsys, "--dataset", "gsm8k", "--input", src, "--output", out)
    assert code == 2 and "--overwrite" in err
    assert out.read_bytes() == b"keep me"
    res = run("--dataset", "gsm8k", "--input", src, "--output", out, "--overwrite")
    assert res.returncode == 0, res.stderr
    assert len(pd.read_parquet(out)) == 4


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--split-test", "2"], "go together"),
        (["--split-test", "4", "--test-output", "t.parquet"], "leaves no training rows"),
    ],
)
def test_split_argument_errors(tmp_path, capsys, extra, message):
    src = write(tmp_path / "gsm8k.jsonl", GSM8K)
    extra = [str(tmp_path / a) if a.endswith(".parquet") else a for a in extra]
    code, err = run_in_process(capsys, "--dataset", "gsm8k", "--input", src, "--output", tmp_path / "o.parquet", *extra)
    assert code != 0 and message in err
    assert not (tmp_path / "o.parquet").exists()


def _tool_names(config: str) -> list[str]:
    import yaml

    path = Path(__file__).resolve().parents[1] / "recipe" / "tools" / "configs" / config
    return [t["tool_schema"]["function"]["name"] for t in yaml.safe_load(path.read_text())["tools"]]


@pytest.mark.parametrize("dataset,records,tool,config,n_out", [
    ("gsm8k", GSM8K, "calculator", "calculator.yaml", 4),
    ("dapo-math-17k", DAPO, "python", "python_tool.yaml", 3),  # DAPO's repeats are still dropped
])
def test_tool_rows_are_verls_multi_turn_format_for_the_shipped_tool(tmp_path, dataset, records, tool, config, n_out):
    src = write(tmp_path / "in.parquet", records)
    out = tmp_path / "train.parquet"
    res = run("--dataset", dataset, "--input", src, "--output", out, "--tool", tool)
    assert res.returncode == 0, res.stderr
    (name,) = _tool_names(config)
    assert f"rows out {n_out} -> {out}" in res.stdout and f"multi-turn rows for the {name} tool (tool_agent)" in \
        res.stdout
    df = pd.read_parquet(out)
    assert len(df) == n_out and df["agent_name"].eq("tool_agent").all()
    for row in df.itertuples():
        system, user = list(row.prompt)
        assert system["role"] == "system" and f"`{name}`" in system["content"] and "<tool_call>" in system["content"]
        assert user["role"] == "user" and "\\boxed{}" in user["content"]
        assert row.extra_info["need_tools_kwargs"] is True
        assert row.extra_info["tools_kwargs"] == {name: {"create_kwargs": {
            "ground_truth": row.reward_model["ground_truth"]}}}


def test_tool_rows_load_through_verls_dataset_with_the_agent_and_tool_kwargs(tmp_path, tiny_artifacts):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    src = write(tmp_path / "in.jsonl", GSM8K)
    out = tmp_path / "train.parquet"
    assert run("--dataset", "gsm8k", "--input", src, "--output", out, "--tool", "calculator").returncode == 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_artifacts.model_dir)
    config = OmegaConf.create({"max_prompt_length": 512, "filter_overlong_prompts": False, "need_tools_kwargs": True,
                               "return_raw_chat": True})
    item = RLHFDataset(data_files=[str(out)], tokenizer=tokenizer, config=config)[0]
    assert item["agent_name"] == "tool_agent"
    assert item["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": "72"}}}
    assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]
