"""Synthetic tasks for the trained tiny model (``recipe.tiny.sft``): prompts, reference answers, verl rows.

Two tasks, both answering ``... #### <answer>`` so that ``reward/math_reward.py`` scores them unchanged:

- **countdown** (the length task): "Count down from N." The answer lists ``N N-1 ... 1.`` (one token a number),
  so its length is set by the prompt (N = 1..``MAX_COUNT``: ~5 to ~115 tokens), with spread within a prompt from an
  optional closing sentence drawn at random (0 to 13 tokens). What a tiny model must learn is easy on purpose (a few
  minutes on a CPU): the first number is the prompt's last, a fixed distance back; each next one is the predecessor
  of the token before it; the stop follows a fixed token ("1").
- **calculator** (the tool task): GSM8K-style word problems. The first assistant turn is a hermes tool call
  ``<tool_call>\\n{"name": "calculator", "arguments": {"expression": "12*7+3"}}\\n</tool_call>`` (verl's ``hermes``
  parser, ``recipe/tools/verl_tools.py``'s ``CalculatorTool``); the tool's reply comes back in a user turn as
  ``<tool_response>\\n87\\n</tool_response>`` and the assistant answers ``The answer is 87. #### 87``. Some of the
  SFT conversations instead answer at once with a guess, near but never equal to the result
  (:func:`direct_messages`): the model starts RL calling the tool on most prompts, not all, and what GRPO can teach
  it within a CPU run is to call the tool (a guess earns nothing).

Also the chat template: Qwen3's (tools in the system prompt, assistant ``tool_calls`` rendered as ``<tool_call>``
blocks, ``tool`` messages inside a user turn) without the ``<think>`` branches, like ``recipe.tiny.artifacts``'s.
Pure Python: no torch, no verl.
"""
from __future__ import annotations

import json
import random

from ..tools.calculator import CALCULATOR_SCHEMA
from .artifacts import _ITEMS, _NAMES, IM_END, IM_START

COUNT_SOURCE = "recipe/tiny_countdown"
TOOL_SOURCE = "recipe/tiny_calculator"
MAX_COUNT = 99
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"

# The schema verl's ToolAgentLoop passes as ``tools`` (recipe/tools/configs/calculator.yaml, dumped by pydantic with
# exclude_unset/exclude_none; test_tiny_sft.py checks they are equal), in the same key order.
CALCULATOR_TOOL = CALCULATOR_SCHEMA

# Qwen3's template (tools block and tool-call / tool-response rendering verbatim) minus its <think> handling.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] or '' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if message['tool_calls'] %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call['function'] %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call['name'] }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1]['role'] != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1]['role'] != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Closing sentences of different lengths, drawn at random: the spread of lengths within a prompt.
_CLOSINGS = ("", "", "", "Done.", "Liftoff!", "All done, that was fun to count.",
             "And that is the end of the countdown, thank you for listening.")


# ---------------------------------------------------------------- countdown


def countdown_prompt(n: int) -> str:
    return f"Count down from {n}."


def countdown_answer(n: int, rng: random.Random) -> str:
    """The reference answer for ``n``: the numbers, an optional closing sentence, ``#### n``."""
    closing = rng.choice(_CLOSINGS)
    body = " ".join(str(k) for k in range(n, 0, -1)) + "."
    return " ".join(part for part in (body, closing) if part) + f" #### {n}"


def countdown_messages(n: int, rng: random.Random) -> list[dict]:
    return [{"role": "user", "content": countdown_prompt(n)},
            {"role": "assistant", "content": countdown_answer(n, rng)}]


# ---------------------------------------------------------------- calculator (tool) task


def tool_problem(rng: random.Random) -> tuple[str, str, int]:
    """One word problem: ``(question, calculator expression, integer result)``."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    a, b, c = rng.randint(2, 30), rng.randint(2, 12), rng.randint(1, 40)
    if kind == 0:
        return (f"{name} has {a} boxes with {b} {item} in each box and {c} more {item}. "
                f"How many {item} does {name} have?", f"{a}*{b}+{c}", a * b + c)
    if kind == 1:
        c = rng.randint(1, a * b - 1)
        return (f"{name} buys {a} packs of {b} {item} and gives {c} away. How many {item} are left?",
                f"{a}*{b}-{c}", a * b - c)
    if kind == 2:
        return (f"{name} shares {a * b} {item} equally among {b} friends. How many {item} does each friend get?",
                f"{a * b}/{b}", a)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return (f"{name} has {a} {item}, buys {b} more and then {c} more. How many {item} does {name} have now?",
            f"{a}+{b}+{c}", a + b + c)


def tool_call_text(expression: str) -> str:
    """The assistant turn that calls the calculator, as Qwen3 writes it (and verl's hermes parser reads it)."""
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"{TOOL_CALL}\n{call}\n{TOOL_CALL_END}"


def tool_messages(rng: random.Random) -> tuple[list[dict], int]:
    """A whole tool conversation (user, assistant tool call, tool reply, assistant answer) and its answer."""
    question, expression, result = tool_problem(rng)
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                          "arguments": {"expression": expression}}}]},
        {"role": "tool", "name": "calculator", "content": str(result)},
        {"role": "assistant", "content": f"The answer is {result}. #### {result}"},
    ], result


def direct_messages(rng: random.Random) -> tuple[list[dict], int]:
    """A tool prompt answered without the tool: a guess 1-9 off the result (user, assistant answer), and the result."""
    question, _, result = tool_problem(rng)
    guess = result + rng.randint(1, 9) * (1 if result < 10 or rng.random() < 0.5 else -1)
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": f"The answer is {guess}. #### {guess}"},
    ], result


# ---------------------------------------------------------------- plain-text rendering (tokenizer training, tests)


def render(messages: list[dict], tools: list[dict] | None = None) -> str:
    """The chat template's text without jinja (what ``apply_chat_template`` renders; tests check they agree)."""
    out = []
    if tools:
        out.append(f"{IM_START}system\n")
        if messages[0]["role"] == "system":
            out.append(messages[0]["content"] + "\n\n")
        out.append("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                   "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
        out.extend("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        out.append('\n</tools>\n\nFor each function call, return a json object with function name and arguments '
                   'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
                   f'<args-json-object>}}\n</tool_call>{IM_END}\n')
    elif messages[0]["role"] == "system":
        out.append(f"{IM_START}system\n{messages[0]['content']}{IM_END}\n")
    for i, m in enumerate(messages):
        if m["role"] == "user" or (m["role"] == "system" and i > 0):
            out.append(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
        elif m["role"] == "assistant":
            out.append(f"{IM_START}assistant\n{assistant_text(m)}{IM_END}\n")
        elif m["role"] == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append(f"{IM_START}user")
            out.append(f"\n{TOOL_RESPONSE}\n{m['content']}\n{TOOL_RESPONSE_END}")
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                out.append(f"{IM_END}\n")
    return "".join(out)


def assistant_text(message: dict) -> str:
    """What the model writes for an assistant message (without the closing ``<|im_end|>``)."""
    content = message.get("content") or ""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
        calls.append(f'{TOOL_CALL}\n{{"name": "{fn["name"]}", "arguments": {args}}}\n{TOOL_CALL_END}')
    return content + ("\n" if content and calls else "") + "\n".join(calls)


# ---------------------------------------------------------------- verl RL rows


def countdown_rows(n_rows: int, seed: int, split: str) -> list[dict]:
    """``n_rows`` countdown prompts (N uniform in 1..MAX_COUNT) as verl RL rows; ground truth N."""
    rng = random.Random(f"countdown-{seed}-{split}")
    rows = []
    for i in range(n_rows):
        n = rng.randint(1, MAX_COUNT)
        rows.append({
            "data_source": COUNT_SOURCE,
            "prompt": [{"role": "user", "content": countdown_prompt(n)}],
            "ability": "count",
            "reward_model": {"style": "rule", "ground_truth": str(n)},
            "extra_info": {"index": i, "split": split, "count": n},
        })
    return rows


def calculator_rows(n_rows: int, seed: int, split: str) -> list[dict]:
    """``n_rows`` calculator word problems as verl RL rows for ``ToolAgentLoop`` (``agent_name: tool_agent``, the tool
    config ``recipe/tools/configs/calculator.yaml``, parser ``hermes``)."""
    rng = random.Random(f"calculator-{seed}-{split}")
    rows = []
    for i in range(n_rows):
        question, expression, result = tool_problem(rng)
        rows.append({
            "data_source": TOOL_SOURCE,
            "agent_name": "tool_agent",
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(result)},
            "extra_info": {
                "index": i, "split": split, "expression": expression,
                "need_tools_kwargs": True,
                "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": str(result)}}},
            },
        })
    return rows
