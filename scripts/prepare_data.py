"""Convert GSM8K, DAPO-Math-17k, DeepScaleR or AIME 2024 records into verl's RL parquet, one boxed-answer prompt.

Any other parquet needs no conversion: name its prompt and answer columns (``PROMPT_KEY=question
ANSWER_KEY=answer bash scripts/train_grpo.sh``; the dataset turns plain text into a user message and the answer into
``reward_model.ground_truth``, ``recipe/user_data.py``), and score it with your own ``REWARD_FUNCTION_PATH``.

    python scripts/prepare_data.py --dataset {gsm8k,dapo-math-17k,deepscaler,aime24} \
        --input FILE(.jsonl|.json|.parquet) --output OUT.parquet [--split-test N --test-output TEST.parquet] \
        [--limit N] [--keep-duplicates] [--overwrite] [--tool {calculator,python}]

Every row gets the same instruction (reason step by step, final answer in ``\\boxed{}``) so that one reward
(``reward/math_reward.py``) and one response-length budget fit all four sources; DAPO's own "Answer: $Answer"
wrapper is removed rather than stacked under ours. Output columns: ``data_source``, ``prompt`` (one user
message), ``ability`` ("math"), ``reward_model`` {"style": "rule", "ground_truth"}, ``extra_info`` {"index"
(row number in its file), "split", "question", "answer", plus "source_id" (DAPO's uuid, AIME's id) and "solution"
(DeepScaleR, AIME)}.

``aime24`` (a validation set, ``TEST_FILE``) reads HuggingFaceH4/aime_2024 (``id``, ``problem``, ``solution``,
``answer``, ...) or Maxwell-Jia/AIME_2024 (``ID``, ``Problem``, ``Solution``, ``Answer``): column names in any case,
``id`` and ``solution`` optional, so any problem/answer file of competition math converts too. Fetch it where the
hub is reachable, e.g. ``python -c "import datasets; datasets.load_dataset('HuggingFaceH4/aime_2024',
split='train').to_parquet('aime_2024.raw.parquet')"``.

``--tool`` writes verl's multi-turn format for ``ToolAgentLoop`` instead (GSM8K with ``calculator``, DAPO-Math with
``python``): a system message that says how to call the tool, ``agent_name: tool_agent``, and
``extra_info.tools_kwargs`` / ``need_tools_kwargs``; the tool itself comes from the launch's tool config
(``recipe/tools/configs/calculator.yaml`` or ``python_tool.yaml``, whose tool names these match).

Repeated prompts are dropped (first occurrence kept; ``--keep-duplicates`` keeps them): the published DAPO-Math-17k
parquet repeats each of its ~17.9k problems about 100 times (~1.79M rows), which at batch 32 makes an epoch ~56k steps,
so the length-aware sampler (which re-orders between epochs) and the cap never engage. Two rows are the same prompt
when the problem text the model sees is the same; the summary line says how many rows were dropped, and how many of
the dropped rows had a different ground truth from the kept one.
"""

from __future__ import annotations

import argparse
import json
import numbers
import random
import sys
from pathlib import Path

import pandas as pd

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# DAPO-Math-17k wraps every problem as PREFIX + "\n\n" + problem + "\n\n" + SUFFIX.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'


# --tool: the tool's name in recipe/tools/configs/*.yaml, and the system message that tells the model how to use it
# (the chat template adds the tool's schema; the reward still reads the \boxed{} answer).
TOOL_PROMPTS = {
    "calculator": ("calculator", "You can call the `calculator` tool to evaluate arithmetic exactly: emit "
                   "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"...\"}}</tool_call> "
                   "and wait for its <tool_response>. Call it whenever you compute, then give the final answer."),
    "python": ("code_interpreter", "You can call the `code_interpreter` tool to run Python in a sandbox: emit "
               "<tool_call>{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"...\"}}</tool_call> "
               "and wait for its <tool_response> (what the program prints). Use it to compute or check, then give "
               "the final answer."),
}
AGENT_NAME = "tool_agent"  # verl 0.9.1's ToolAgentLoop (experimental/agent_loop/tool_agent_loop.py)


class InputError(Exception):
    """The input does not have the shape of the chosen dataset; the message names the file, row and column."""


def make_prompt(problem: str) -> list[dict]:
    return [{"role": "user", "content": f"{problem.strip()}\n\n{INSTRUCTION}"}]


def _field(record: dict, column: str, where: str):
    """``record[column]``, where ``column`` may be dotted (``reward_model.ground_truth``) into nested dicts."""
    value = record
    for key in column.split("."):
        if not isinstance(value, dict) or key not in value:
            raise InputError(f"{where}: missing column '{column}' (columns present: {sorted(map(str, record))})")
        value = value[key]
    return value


def _text(record: dict, column: str, where: str) -> str:
    value = _field(record, column, where)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: column '{column}' must be a non-empty string, got {value!r:.80}")
    return value.strip()


def convert_gsm8k(record: dict, where: str) -> dict:
    question, answer = _text(record, "question", where), _text(record, "answer", where)
    if "####" not in answer:
        raise InputError(f"{where}: column 'answer' has no '#### <number>' final line")
    ground_truth = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return {
        "data_source": "openai/gsm8k",
        "problem": question,
        "ground_truth": ground_truth,
        "extra": {"question": question, "answer": answer},
    }


def convert_dapo(record: dict, where: str) -> dict:
    messages = _field(record, "prompt", where)
    if hasattr(messages, "tolist"):  # parquet gives a numpy array of dicts
        messages = messages.tolist()
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], dict):
        raise InputError(f"{where}: column 'prompt' must be a list with exactly one message dict")
    content = _text(messages[0], "content", f"{where} prompt[0]")
    if not (content.startswith(DAPO_PREFIX) and content.endswith(DAPO_SUFFIX)):
        raise InputError(f"{where}: column 'prompt' is not in DAPO-Math-17k's 'Solve the following ...' template")
    problem = content[len(DAPO_PREFIX) : -len(DAPO_SUFFIX)].strip()
    if not problem:
        raise InputError(f"{where}: column 'prompt' holds the DAPO template with no problem in it")
    ground_truth = _text(record, "reward_model.ground_truth", where)
    source_id = str(_field(record, "extra_info.index", where))
    return {
        "data_source": "BytedTsinghua-SIA/DAPO-Math-17k",
        "problem": problem,
        "ground_truth": ground_truth,
        "extra": {"question": problem, "answer": ground_truth, "source_id": source_id},
    }


def convert_deepscaler(record: dict, where: str) -> dict:
    problem, answer = _text(record, "problem", where), _text(record, "answer", where)
    solution = _field(record, "solution", where)
    return {
        "data_source": "agentica-org/DeepScaleR-Preview-Dataset",
        "problem": problem,
        "ground_truth": answer,
        "extra": {"question": problem, "answer": answer, "solution": "" if solution is None else str(solution)},
    }


def _column(record: dict, name: str, where: str, required: bool = True) -> str | None:
    """The record's column called ``name`` in any case (``problem`` or ``Problem``)."""
    found = [key for key in record if str(key).lower() == name]
    if len(found) == 1:
        return found[0]
    if found:
        raise InputError(f"{where}: columns {found} differ only in case; keep one")
    if required:
        raise InputError(f"{where}: missing column '{name}' (any case; columns present: {sorted(map(str, record))})")
    return None


def convert_aime(record: dict, where: str) -> dict:
    problem = _text(record, _column(record, "problem", where), where)
    answer = _text(record, _column(record, "answer", where), where)
    extra = {"question": problem, "answer": answer}
    for name, key in (("id", "source_id"), ("solution", "solution")):
        column = _column(record, name, where, required=False)
        if column is not None and record[column] is not None:
            extra[key] = str(record[column])
    return {"data_source": "aime24", "problem": problem, "ground_truth": answer, "extra": extra}


CONVERTERS = {"gsm8k": convert_gsm8k, "dapo-math-17k": convert_dapo, "deepscaler": convert_deepscaler,
              "aime24": convert_aime}


def read_records(path: Path) -> list[dict]:
    """Records from JSON lines, a JSON list (or JSON lines named .json, as ``datasets.to_json`` writes), or
    parquet. JSON is read with ``json`` rather than pandas so answers like "0.50" keep their exact text."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        records = pd.read_parquet(path).to_dict("records")
    elif suffix in (".json", ".jsonl"):
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        records = data if isinstance(data, list) else [data]
    else:
        raise InputError(f"{path}: unsupported extension '{path.suffix}' (expected .jsonl, .json or .parquet)")
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(f"{path} row {i}: expected an object with columns, got {type(record).__name__}")
    return records


def drop_duplicate_prompts(converted: list[dict]) -> tuple[list[dict], int]:
    """(rows whose problem text appears for the first time, how many dropped rows had another ground truth)."""
    kept, first_truth, conflicts = [], {}, 0
    for c in converted:
        truth = first_truth.get(c["problem"])
        if truth is None:
            first_truth[c["problem"]] = c["ground_truth"]
            kept.append(c)
        elif truth != c["ground_truth"]:
            conflicts += 1
    return kept, conflicts


def to_verl_rows(converted: list[dict], split: str, tool: str | None = None) -> list[dict]:
    rows = [
        {
            "data_source": c["data_source"],
            "prompt": make_prompt(c["problem"]),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": c["ground_truth"]},
            "extra_info": {"index": i, "split": split, **c["extra"]},
        }
        for i, c in enumerate(converted)
    ]
    if tool is not None:
        name, system = TOOL_PROMPTS[tool]
        for row in rows:
            row["prompt"] = [{"role": "system", "content": system}, *row["prompt"]]
            row["agent_name"] = AGENT_NAME
            # verl's (former) tools took the row's ground truth at creation, for a tool-side reward; the recipe's
            # tools ignore it (and parquet cannot store an empty struct)
            truth = row["reward_model"]["ground_truth"]
            row["extra_info"].update(need_tools_kwargs=True,
                                     tools_kwargs={name: {"create_kwargs": {"ground_truth": truth}}})
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, choices=sorted(CONVERTERS))
    parser.add_argument("--input", required=True, type=Path, help=".jsonl, .json or .parquet")
    parser.add_argument("--output", required=True, type=Path, help="train parquet")
    parser.add_argument("--split-test", type=int, default=0, metavar="N", help="hold out N random rows as test")
    parser.add_argument("--test-output", type=Path, help="test parquet (required with --split-test)")
    parser.add_argument("--limit", type=int, metavar="N", help="use only the first N input rows")
    parser.add_argument("--seed", type=int, default=0, help="seed for the --split-test sample")
    parser.add_argument(
        "--keep-duplicates",
        action="store_true",
        help="keep rows whose prompt repeats an earlier row's (default: drop them; if kept, --split-test may hold "
        "out copies of training prompts)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing output files")
    parser.add_argument("--tool", choices=sorted(TOOL_PROMPTS), help="multi-turn rows for verl's ToolAgentLoop with "
                        "this tool (calculator: recipe/tools/configs/calculator.yaml; python: python_tool.yaml)")
    args = parser.parse_args(argv)
    if args.split_test < 0 or (args.limit is not None and args.limit < 1):
        parser.error("--split-test must be >= 0 and --limit >= 1")
    if bool(args.split_test) != bool(args.test_output):
        parser.error("--split-test N and --test-output FILE go together")
    outputs = [args.output] + ([args.test_output] if args.test_output else [])
    if len({p.resolve() for p in outputs + [args.input]}) != len(outputs) + 1:
        parser.error("--input, --output and --test-output must be different files")
    for out in outputs:
        if out.exists() and not args.overwrite:
            parser.error(f"{out} exists; pass --overwrite to replace it")
    if not args.input.is_file():
        parser.error(f"input file not found: {args.input}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        records = read_records(args.input)
        n_file = len(records)
        records = records[: args.limit]
        convert = CONVERTERS[args.dataset]
        converted = [convert(r, f"{args.input} row {i} (--dataset {args.dataset})") for i, r in enumerate(records)]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    n_in = len(converted)
    conflicts = 0
    if not args.keep_duplicates:
        converted, conflicts = drop_duplicate_prompts(converted)
    if args.split_test >= len(converted):
        print(f"error: --split-test {args.split_test} leaves no training rows out of {len(converted)}", file=sys.stderr)
        return 1

    test_ids = set(random.Random(args.seed).sample(range(len(converted)), args.split_test))
    train = [c for i, c in enumerate(converted) if i not in test_ids]
    test = [c for i, c in enumerate(converted) if i in test_ids]
    for out in (args.output, args.test_output):
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(to_verl_rows(train, "train", args.tool)).to_parquet(args.output, index=False)
    limited = f" (first {n_in} of {n_file})" if n_in < n_file else ""
    summary = f"{args.dataset}: rows in {n_in}{limited}, rows out {len(train)} -> {args.output}"
    if test:
        pd.DataFrame(to_verl_rows(test, "test", args.tool)).to_parquet(args.test_output, index=False)
        summary += f" + {len(test)} -> {args.test_output}"
    if args.tool:
        summary += f"; multi-turn rows for the {TOOL_PROMPTS[args.tool][0]} tool ({AGENT_NAME})"
    if args.keep_duplicates:
        summary += "; duplicate prompts kept (--keep-duplicates)"
    else:
        summary += f"; dropped {n_in - len(converted)} rows repeating an earlier prompt"
        if conflicts:
            summary += f" ({conflicts} of them with a different ground truth: the first row's was kept)"
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
