"""Rule-based math reward (1.0 correct / 0.0 otherwise) for DAPO-Math-17k, DeepScaleR and GSM8K style data.

Entry point for verl's ``reward.custom_reward_function`` (``name: compute_score``). verl 0.9.1 calls it with
keywords ``data_source, solution_str, ground_truth, extra_info`` from a thread-pool executor
(``experimental/reward_loop/reward_manager/naive.py``), so it must be cheap, thread-safe and never raise.

Comparison runs in two stages: a conservative pure-Python check (normalised strings, exact rationals) that
accepts the common cases without any dependency, then math-verify for the rest. math-verify bounds its own
work with ``signal.alarm``, which only works in a main thread, so it runs in a few long-lived helper
processes where it is the main thread; a helper that overruns is killed and restarted.

Unfinished thinking. A response cut by the response cap or ``response_length`` while still inside ``<think>`` has
no final answer, only drafts; scoring a tentative ``\\boxed{}`` from it would reward truncation (and favour the
arm that truncates more). By default such a response scores as no answer (0.0). Options, passed by verl as
``reward.custom_reward_function.reward_kwargs.<name>`` (``+`` prefix on the command line):

- ``unclosed_think``: ``"no_answer"`` (default) or ``"search"`` (the old behaviour: search the unfinished thinking).
- ``think_in_prompt``: ``True`` when the chat template opens ``<think>`` in the prompt (e.g. Qwen3-*-Thinking-2507),
  so a response is unfinished thinking until its ``</think>``. Default ``False`` (Qwen3 hybrid models write
  ``<think>`` in the response; a response without any tag, from a non-thinking model, is scored as it is).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import numbers
import queue
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction

logger = logging.getLogger(__name__)

# Only the end of a response can hold the final answer; bounding the scan keeps 16k-token responses cheap.
TAIL_CHARS = 4000
# A longer "answer" is not an answer; the bound also keeps sympy away from pathological inputs.
MAX_ANSWER_CHARS = 500
# Per parse/verify step inside a helper (whole seconds: math-verify uses signal.alarm).
MATH_VERIFY_TIMEOUT_S = 3
# Backstop for a helper stuck where the alarm cannot interrupt it (two parses + one verify + slack).
_REQUEST_TIMEOUT_S = 3 * MATH_VERIFY_TIMEOUT_S + 5
_STARTUP_TIMEOUT_S = 60
MATH_VERIFY_PROCESSES = 4

# Checked, not imported: the parent never needs sympy, and the module must import without math-verify.
MATH_VERIFY_AVAILABLE = importlib.util.find_spec("math_verify") is not None


UNCLOSED_THINK_MODES = ("no_answer", "search")
_KWARGS_KEY = "reward.custom_reward_function.reward_kwargs"


def compute_score(
    data_source,
    solution_str,
    ground_truth,
    extra_info=None,
    unclosed_think: str = "no_answer",
    think_in_prompt: bool = False,
    **kwargs,
) -> float:
    """Score one response: 1.0 if its final answer equals ``ground_truth``, else 0.0.

    ``unclosed_think``/``think_in_prompt``: see the module docstring. ``**kwargs`` absorbs what else verl may add
    (``reward_router_address``, ``reward_model_tokenizer``). Any failure on the response scores 0.0: a malformed
    response must not kill a training step; a bad option raises (a config error must not score silently).
    """
    if unclosed_think not in UNCLOSED_THINK_MODES:
        raise ValueError(
            f"{_KWARGS_KEY}.unclosed_think={unclosed_think!r}: expected one of {', '.join(UNCLOSED_THINK_MODES)}"
        )
    if not isinstance(think_in_prompt, bool):
        raise ValueError(f"{_KWARGS_KEY}.think_in_prompt={think_in_prompt!r}: expected true or false")
    try:
        gold = _ground_truth_text(ground_truth)
        if unclosed_think == "no_answer" and thinking_unfinished(solution_str, think_in_prompt):
            return 0.0
        pred = extract_answer(solution_str)
        if gold is None or pred is None:
            return 0.0
        return 1.0 if is_equiv(pred, gold) else 0.0
    except Exception:
        logger.exception("math reward failed; scoring 0.0")
        return 0.0


# ---------------------------------------------------------------- answer extraction

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_ANSWER_RE = re.compile(r"(?i)\banswer\s*(?:\*\*)?\s*:[ \t]*([^\n]*\S)")
_GSM8K_RE = re.compile(r"####[ \t]*([^\n]*\S)")
_BARE_BOX_ARG_RE = re.compile(r"[^\s${}]+")


def thinking_unfinished(text, think_in_prompt: bool = False) -> bool:
    """Whether ``text`` stops inside its thinking: a ``<think>`` with no ``</think>`` after it (or, when the template
    opened ``<think>`` in the prompt, no ``</think>`` at all). Searches the whole text: the tag opens at the start."""
    if not isinstance(text, str):
        return False
    close = text.rfind("</think>")
    return text.rfind("<think>") > close or (think_in_prompt and close < 0)


def extract_answer(text) -> str | None:
    """The response's final answer: whichever of last ``\\boxed{}``/``\\fbox{}``, ``Answer: ...`` or
    ``#### ...`` comes last, searched in the last ``TAIL_CHARS`` characters after any ``</think>``."""
    if not isinstance(text, str):
        return None
    tail = text[-TAIL_CHARS:]
    end_think = tail.rfind("</think>")
    if end_think >= 0:
        tail = tail[end_think + len("</think>") :]
    candidates = [c for c in (_last_boxed(tail), _last_line(_ANSWER_RE, tail), _last_line(_GSM8K_RE, tail)) if c]
    if not candidates:
        return None
    answer = max(candidates)[1]
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    return _strip_delimiters(answer) or None


_OPENERS = ("$", r"\(", r"\[", "**")
_CLOSERS = ("$", r"\)", r"\]", "**", ".")


def _strip_delimiters(s: str) -> str:
    """``$5$.``, ``\\(5\\)``, ``**5**`` -> ``5``: what surrounds an "Answer:" line is not part of the answer."""
    previous = None
    while s != previous:
        previous = s
        s = s.strip()
        for token in _OPENERS:
            s = s.removeprefix(token)
        for token in _CLOSERS:
            s = s.removesuffix(token)
    return s


def _last_boxed(text: str) -> tuple[int, str] | None:
    """(position, content) of the last ``\\boxed`` whose braces balance; an unclosed one (a response cut
    off mid-answer) yields to the one before it."""
    for m in reversed(list(_BOX_RE.finditer(text))):
        content = _box_argument(text, m.end())
        if content is not None:
            return m.start(), content
    return None


def _box_argument(text: str, i: int) -> str | None:
    """Content of the braced group at ``text[i]`` (``\\{``/``\\}`` do not count), or the bare token of
    ``\\boxed 5``; None if the group never closes."""
    if not text.startswith("{", i):
        m = _BARE_BOX_ARG_RE.match(text, i)
        return m.group(0) if m else None
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def _last_line(pattern: re.Pattern, text: str) -> tuple[int, str] | None:
    last = None
    for last in pattern.finditer(text):
        pass
    return (last.start(), last.group(1)) if last else None


def _ground_truth_text(ground_truth) -> str | None:
    if isinstance(ground_truth, numbers.Real) and not isinstance(ground_truth, bool):
        return str(ground_truth)
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        return None
    boxed = _last_boxed(ground_truth)  # tolerate a MATH-style solution given as the ground truth
    return (boxed[1] if boxed else ground_truth).strip()


# ---------------------------------------------------------------- comparison


def is_equiv(pred: str, gold: str) -> bool:
    """Pure-Python verdict when it has one (most matches, and wrong numbers against an integer ground truth,
    the common case for GSM8K/DAPO); math-verify only for the rest."""
    verdict = _exact_verdict(pred, gold)
    if verdict is not None:
        return verdict
    return MATH_VERIFY_AVAILABLE and _math_verify_equiv(gold, pred)


_UNIT_RE = re.compile(r"^(.+?)\s*\\(?:text|mbox|mathrm)\{\s*[A-Za-z][A-Za-z .]*\}(?:\^\{?\d\}?)?$")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_ASSIGN_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*([^=]+)$")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)"
_NUMBER_RE = re.compile(rf"[+-]?{_NUM}")
_FRAC_RE = re.compile(rf"([+-]?)\\frac\{{({_NUM})\}}\{{({_NUM})\}}")
_SLASH_RE = re.compile(rf"([+-]?)({_NUM})/({_NUM})")
_DROPPED_TOKENS = (r"\left", r"\right", r"\displaystyle", r"\!", r"\,", r"\;", r"\:", r"\$", r"\%", "$", "%", "°")


def normalize_answer(s: str) -> str:
    """Canonical string form: drops math delimiters, sizing/spacing macros, ``$``/``%``/degree marks, trailing
    ``\\text{ unit}``, ``x =`` prefixes, thousands commas (also ``{,}``), whitespace and a trailing period;
    ``\\dfrac``/``\\tfrac`` -> ``\\frac``, ``\\frac12`` -> ``\\frac{1}{2}``, ``\\sqrt2`` -> ``\\sqrt{2}``,
    U+2212 -> ``-``."""
    for token in _DROPPED_TOKENS:
        s = s.replace(token, "")
    s = _DEGREE_RE.sub("", s).replace(r"\ ", " ").replace("{,}", ",").replace("\u2212", "-").strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    unit = _UNIT_RE.match(s)
    if unit:
        s = unit.group(1)
    s = _TEXT_RE.sub(r"\1", s).strip().rstrip(".").strip()
    assign = _ASSIGN_RE.match(s)
    if assign:
        s = assign.group(1)
    s = re.sub(r"\s+", "", s)
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    return s[1:] if s.startswith("+") else s


def _to_fraction(s: str) -> Fraction | None:
    """Exact value of an integer, decimal, ``a/b`` or ``\\frac{a}{b}`` (no exponent notation, so a
    crafted ``1e999999999`` cannot allocate a huge integer)."""
    if _NUMBER_RE.fullmatch(s):
        return Fraction(s)
    m = _FRAC_RE.fullmatch(s) or _SLASH_RE.fullmatch(s)
    if m and Fraction(m.group(3)) != 0:
        value = Fraction(m.group(2)) / Fraction(m.group(3))
        return -value if m.group(1) == "-" else value
    return None


def _exact_verdict(pred: str, gold: str) -> bool | None:
    """True if equal after ``normalize_answer`` or equal as exact numbers; False if both are exact numbers, the
    ground truth an integer, and they differ; None (undecided) otherwise, e.g. ``0.3333333`` vs ``\\frac{1}{3}``,
    which math-verify accepts within its rounding."""
    a, b = normalize_answer(pred), normalize_answer(gold)
    if a == b:
        return bool(a) or None
    x, y = _to_fraction(a), _to_fraction(b)
    if x is None or y is None:
        return None
    return True if x == y else (False if y.denominator == 1 else None)


def fallback_equiv(pred: str, gold: str) -> bool:
    """The comparison without math-verify: equal after ``normalize_answer``, or the same exact number
    (``0.5`` == ``\\frac{1}{2}``, ``42.0`` == ``42``). It never claims equality it cannot show."""
    return _exact_verdict(pred, gold) is True


# ---------------------------------------------------------------- math-verify helper processes

_WORKER_SRC = """
import json, sys
sys.path[:] = json.loads(sys.argv[2])
from math_verify import parse, verify
from math_verify.errors import TimeoutException
t = int(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    gold, pred = json.loads(line)
    try:
        ok = bool(verify(parse(gold, parsing_timeout=t), parse(pred, parsing_timeout=t), timeout_seconds=t))
    except (Exception, TimeoutException):
        ok = False
    print(json.dumps(ok), flush=True)
"""


class _HelperError(Exception):
    pass


class _MathVerifyPool:
    """Fixed set of helper processes, each serving one JSON-lines request at a time.

    A slot holds a process or None (not started / killed); callers block for a free slot, so at most
    ``size`` comparisons run at once however many reward threads verl uses.
    """

    def __init__(self, size: int):
        self._slots: queue.LifoQueue = queue.LifoQueue()  # warm helpers first; start more only under load
        for _ in range(size):
            self._slots.put(None)

    def verify(self, gold: str, pred: str) -> bool:
        proc = self._slots.get()
        try:
            if proc is None or proc.poll() is not None:
                proc = self._start()
            proc.stdin.write(json.dumps([gold, pred]) + "\n")
            proc.stdin.flush()
            return _read_line(proc, _REQUEST_TIMEOUT_S) == "true"
        except (OSError, ValueError, _HelperError):
            logger.warning("math-verify helper failed or timed out; restarting it")
            if proc is not None:
                proc.kill()
                proc.wait()
            proc = None
            return False
        finally:
            self._slots.put(proc)

    @staticmethod
    def _start() -> subprocess.Popen:
        proc = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_SRC, str(MATH_VERIFY_TIMEOUT_S), json.dumps(sys.path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # math-verify logs every timeout; the score already reflects it
                text=True,
            )
            if _read_line(proc, _STARTUP_TIMEOUT_S) != "ready":
                raise _HelperError("bad handshake")
        except (OSError, _HelperError) as e:
            if proc is not None:
                proc.kill()
                proc.wait()
            _disable_math_verify()
            raise _HelperError("helper did not start") from e
        return proc


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    readable, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if readable else ""
    if not line:
        raise _HelperError("no reply")
    return line.strip()


_pool: _MathVerifyPool | None = None
_pool_lock = threading.Lock()


def _disable_math_verify() -> None:
    """A helper that cannot even start will not start next time either: stop paying for the attempt."""
    global MATH_VERIFY_AVAILABLE
    if MATH_VERIFY_AVAILABLE:
        logger.warning("math-verify helper did not start; using the pure-Python comparison only")
    MATH_VERIFY_AVAILABLE = False


def _math_verify_equiv(gold: str, pred: str) -> bool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _MathVerifyPool(MATH_VERIFY_PROCESSES)
    return _pool.verify("\\boxed{" + gold + "}", "\\boxed{" + pred + "}")
