"""Math reward: extraction formats, equivalent forms, wrong answers, hostile input, and both comparison paths."""

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward import math_reward
from reward.math_reward import compute_score, extract_answer, fallback_equiv, normalize_answer

REPO = Path(__file__).resolve().parents[1]


def score(response, ground_truth, data_source="math"):
    return compute_score(data_source=data_source, solution_str=response, ground_truth=ground_truth, extra_info={})


@pytest.fixture
def no_math_verify(monkeypatch):
    monkeypatch.setattr(math_reward, "MATH_VERIFY_AVAILABLE", False)


QWEN_BOXED = (
    "<think>\nThe sequence is arithmetic with a_1 = 3 and d = 4, so a_n = 4n - 1. Maybe \\boxed{40}? "
    "No: a_10 = 39.\n</think>\n\nThe common difference is $d = 4$, so $a_{10} = 3 + 9 \\cdot 4 = 39$.\n\n"
    "**Final Answer**\n\\[\n\\boxed{39}\n\\]"
)
# Qwen3 thinking on a DAPO problem, cut by the cap mid-sentence a few hundred tokens after a tentative box (the
# drafts repeat as a long reasoning does).
HERON_DRAFT = (
    "Heron's formula: s = (13 + 14 + 15)/2 = 21, so the area is sqrt(21 * 8 * 7 * 6). 21 * 8 = 168, 7 * 6 = 42, "
    "168 * 42 = 7056 and sqrt(7056) = 84. Hmm, let me double-check with coordinates: put B = (0, 0), C = (14, 0), "
    "A = (x, y) with x^2 + y^2 = 169 and (x - 14)^2 + y^2 = 225, so -28x + 196 = 56, x = 5, y = 12.\n\n"
)
QWEN_CUT_IN_THINKING = (
    "<think>\nOkay, so I need to find the area of triangle ABC with sides 13, 14 and 15. "
    + HERON_DRAFT * 40
    + "So tentatively the area is \\boxed{84}. But wait, the problem might intend the triangle to be obtuse, in "
    "which case I should recheck which side is the base. Let me recompute the altitude from A: since y = 12 and the "
    + "base BC = 14, the area is 14 * 12 / 2 = 84. Now, is there another configuration where A lies on the other "
    "side, say x = -5? Then (x - 14)^2 = 361 and 361 + 144 = 505, which is not 225, so no. Let me also verify "
    + HERON_DRAFT * 6
    + "Alternatively, I could use the law of cosines to get cos B = (169 + 196 - 225) / (2 * 13 * 14) = 140 / 364, so"
)
QWEN_CLOSED = QWEN_CUT_IN_THINKING + " sin B = 12/13 and the area is 84.\n</think>\n\nThe area is $\\boxed{84}$."
# Qwen3-*-Thinking-2507: the template writes "<think>\n" into the prompt; the response only closes it.
QWEN_2507_CUT = QWEN_CUT_IN_THINKING.removeprefix("<think>\n")
QWEN_2507_CLOSED = QWEN_CLOSED.removeprefix("<think>\n")
GSM8K_STYLE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
DAPO_STYLE = "We need the sum of the roots, which by Vieta is $-b/a = 7/1$.\n\nAnswer: 7"


@pytest.mark.parametrize(
    "response, ground_truth",
    [
        (QWEN_BOXED, "39"),
        (GSM8K_STYLE, "72"),
        (DAPO_STYLE, "7"),
        ("Therefore the probability is $\\boxed{\\dfrac{3}{8}}$.", "\\frac{3}{8}"),
        ("So the area is \\boxed{12\\text{ cm}^2}.", "12"),
        ("The angle measures $\\boxed{90^\\circ}$.", "90"),
        ("The total is \\boxed{1,234,567}.", "1234567"),
        ("The total is \\boxed{1{,}000} dollars.", "1000"),
        ("Thus \\boxed{\\left( 1, 2 \\right)}", "(1,2)"),
        ("The ratio is \\boxed{0.375}", "3/8"),
        ("Hence $x = \\boxed{42.0}$", "42"),
        ("\\fbox{17}", "17"),
        ("The set is $\\boxed{\\{1,2\\}}$", "\\{1,2\\}"),
        ("The answer is $\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt3}{2}"),
        ("Answer: $\\frac{1}{2}$.", "0.5"),
        ("**Answer:** 25", "25"),
        ("Answer: x = 5", "5"),
        ("The answer is \\boxed{x=5}", "5"),
        ("Answer: \\boxed{-3}", "-3"),
        ("#### 1,000", "1000"),
        ("\\boxed{50\\%}", "50"),
        ("\\boxed{\\text{(B)}}", "B"),
    ],
)
def test_correct_answers_score_one(response, ground_truth):
    assert score(response, ground_truth) == 1.0


@pytest.mark.parametrize(
    "response, ground_truth",
    [
        (QWEN_BOXED, "40"),  # the draft inside <think> is not the final answer
        (GSM8K_STYLE, "24"),
        (DAPO_STYLE, "-7"),
        ("\\boxed{\\frac{1}{3}}", "0.33"),
        ("\\boxed{12}", "120"),
        ("I think the answer is 5 but I'm not sure.", "5"),  # no final-answer marker
        ("\\boxed{}", "0"),
        ("\\boxed{2 and 3}", "2"),
    ],
)
def test_wrong_or_missing_answers_score_zero(response, ground_truth):
    assert score(response, ground_truth) == 0.0


def test_math_verify_accepts_symbolic_equivalence():
    if not math_reward.MATH_VERIFY_AVAILABLE:
        pytest.skip("math-verify not installed")
    assert score("so the side is \\boxed{3\\sqrt{2}}", "\\sqrt{18}") == 1.0
    assert score("\\boxed{1+x^2}", "x^2+1") == 1.0
    assert score("\\boxed{3\\sqrt{2}}", "\\sqrt{19}") == 0.0


def test_wrong_number_against_integer_is_decided_without_math_verify(monkeypatch):
    def fail(gold, pred):
        raise AssertionError("math-verify should not be needed")

    monkeypatch.setattr(math_reward, "_math_verify_equiv", fail)
    assert score(GSM8K_STYLE, "71") == 0.0
    assert score("\\boxed{0.5}", "1") == 0.0
    assert score("\\boxed{\\frac{144}{2}}", "72") == 1.0


def test_math_verify_decides_non_integer_rounding():
    if not math_reward.MATH_VERIFY_AVAILABLE:
        pytest.skip("math-verify not installed")
    assert score("\\boxed{0.3333333}", "\\frac{1}{3}") == 1.0  # within math-verify's rounding
    assert score("\\boxed{0.33}", "\\frac{1}{3}") == 0.0


def test_helper_that_cannot_start_disables_math_verify(monkeypatch):
    monkeypatch.setattr(math_reward, "MATH_VERIFY_AVAILABLE", True)
    monkeypatch.setattr(math_reward, "_pool", None)
    monkeypatch.setattr(math_reward.sys, "executable", "/nonexistent/python")
    assert score("\\boxed{3\\sqrt{2}}", "\\sqrt{18}") == 0.0
    assert math_reward.MATH_VERIFY_AVAILABLE is False
    assert score("\\boxed{\\dfrac{3}{8}}", "0.375") == 1.0  # the pure-Python path still scores


def test_fallback_handles_common_forms_without_math_verify(no_math_verify):
    assert score(QWEN_BOXED, "39") == 1.0
    assert score("\\boxed{\\dfrac{3}{8}}", "0.375") == 1.0
    assert score("\\boxed{12\\text{ cm}}", "12") == 1.0
    assert score("#### 1,234", "1234") == 1.0
    assert score("\\boxed{-\\frac{1}{2}}", "-1/2") == 1.0
    # Symbolic equivalence needs math-verify; the fallback must not guess.
    assert score("\\boxed{3\\sqrt{2}}", "\\sqrt{18}") == 0.0


def test_response_cut_inside_thinking_scores_as_no_answer():
    assert len(QWEN_CUT_IN_THINKING) > 3 * math_reward.TAIL_CHARS  # ~3.5k tokens; the box lies in the scanned tail
    assert extract_answer(QWEN_CUT_IN_THINKING) == "84"  # what the old behaviour scored
    assert score(QWEN_CUT_IN_THINKING, "84") == 0.0
    assert score(QWEN_CLOSED, "84") == 1.0
    # A draft inside a closed thinking is still not the answer: only what follows </think> counts.
    assert score(QWEN_CLOSED.replace("$\\boxed{84}$", "no idea"), "84") == 0.0


def test_unclosed_think_search_restores_the_old_behaviour():
    assert compute_score("math_dapo", QWEN_CUT_IN_THINKING, "84", None, unclosed_think="search") == 1.0
    assert compute_score("math_dapo", QWEN_CUT_IN_THINKING, "85", None, unclosed_think="search") == 0.0


def test_think_opened_by_the_template():
    # Without the option a 2507-style response has no tag to go by: it is scored as a non-thinking response.
    assert score(QWEN_2507_CUT, "84") == 1.0
    assert compute_score("math_dapo", QWEN_2507_CUT, "84", None, think_in_prompt=True) == 0.0
    assert compute_score("math_dapo", QWEN_2507_CLOSED, "84", None, think_in_prompt=True) == 1.0


@pytest.mark.parametrize(
    "text, in_prompt, unfinished",
    [
        ("<think>\nwork \\boxed{1}", False, True),
        ("<think>a</think>\\boxed{1}", False, False),
        ("<think>a</think> then <think>again", False, True),
        ("no tags \\boxed{1}", False, False),
        ("no tags \\boxed{1}", True, True),
        ("a</think>\\boxed{1}", True, False),
        (None, True, False),
    ],
)
def test_thinking_unfinished(text, in_prompt, unfinished):
    assert math_reward.thinking_unfinished(text, in_prompt) is unfinished


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"unclosed_think": "ignore"}, "reward_kwargs.unclosed_think='ignore': expected one of no_answer, search"),
        ({"think_in_prompt": "yes"}, "reward_kwargs.think_in_prompt='yes': expected true or false"),
    ],
)
def test_bad_option_is_an_error_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(f"reward.custom_reward_function.{message}")):
        compute_score("math", "\\boxed{1}", "1", None, **kwargs)


def test_option_through_verls_reward_kwargs():
    """The options reach compute_score the way verl 0.9.1 passes reward_kwargs from the config."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    def fn(**reward_kwargs):
        fn_config = {"path": str(REPO / "reward" / "math_reward.py"), "name": "compute_score"}
        if reward_kwargs:
            fn_config["reward_kwargs"] = reward_kwargs
        return get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": fn_config}}))

    call = {"data_source": "math_dapo", "solution_str": QWEN_CUT_IN_THINKING, "ground_truth": "84", "extra_info": {}}
    assert fn()(**call) == 0.0
    assert fn(unclosed_think="search")(**call) == 1.0
    assert fn(think_in_prompt=True)(**dict(call, solution_str=QWEN_2507_CUT)) == 0.0


@pytest.mark.parametrize(
    "a, b, equal",
    [
        ("\\left(1,2\\right)", "(1, 2)", True),
        ("\\$18", "18", True),
        ("5.", "5", True),
        ("42.0", "42", True),
        ("\\frac12", "\\frac{1}{2}", True),
        ("1/4", "0.25", True),
        ("+3", "3", True),
        ("\u22125", "-5", True),
        ("1/0", "0", False),
        ("2,3", "23", False),
        ("x", "y", False),
        ("", "", False),
    ],
)
def test_fallback_equiv(a, b, equal):
    assert fallback_equiv(a, b) is equal


def test_normalize_answer_examples():
    assert normalize_answer("\\!\\left[ 2, 3 \\right)") == "[2,3)"
    assert normalize_answer("$\\tfrac{\\sqrt2}{2}$") == "\\frac{\\sqrt{2}}{2}"
    assert normalize_answer("45^{\\circ}") == "45"


def test_extract_answer_picks_the_last_marker():
    assert extract_answer("\\boxed{3} ... on reflection\nAnswer: 4") == "4"
    assert extract_answer("Answer: 4 ... \\boxed{5}") == "5"
    assert extract_answer("\\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert extract_answer("\\boxed 7 apples") == "7"
    assert extract_answer("}}}}\\boxed{1}}}}") == "1"
    # A cut-off final box falls back to the last complete one.
    assert extract_answer("\\boxed{12} then \\boxed{\\frac{1}{2") == "12"
    assert extract_answer("no marker") is None


@pytest.mark.parametrize(
    "response",
    [
        None,
        b"\\boxed{1}",
        12,
        "",
        "\\boxed{",
        "\\boxed{{{{{{",
        "Answer:",
        "####",
        "\\boxed{\\}",
        "\x00\ud800\\boxed{\x00}",
        "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
        "Answer: " + "9" * 100_000,
    ],
)
def test_malformed_responses_score_zero_without_raising(response):
    assert score(response, "1") == 0.0


@pytest.mark.parametrize("ground_truth", [None, "", "   ", [], {"a": 1}])
def test_bad_ground_truth_scores_zero(ground_truth):
    assert score("\\boxed{1}", ground_truth) == 0.0


def test_numeric_ground_truth_is_accepted():
    assert score("\\boxed{72}", 72) == 1.0
    assert score("\\boxed{0.5}", 0.5) == 1.0


def test_long_response_costs_what_its_tail_costs():
    """A 140k-character response costs about what a response of the scanned tail's length costs: ~1.8x here (a few
    whole-text ``rfind``s), 20-30x with the answer searched in the whole text. Timed side by side, best of interleaved
    rounds: a ratio, not the seconds of a given machine."""
    line = "Let me reconsider the factorisation of the polynomial step by step. "
    answer = "\n\nThus the answer is $\\boxed{13}$."
    long_response = line * 2000 + answer  # ~140k chars
    short_response = line * (math_reward.TAIL_CHARS // len(line)) + answer

    def cost(response):
        start = time.perf_counter()
        for _ in range(200):
            assert score(response, "13") == 1.0
        return time.perf_counter() - start

    long_s, short_s = zip(*((cost(long_response), cost(short_response)) for _ in range(7)))
    assert min(long_s) < 5 * min(short_s), (long_s, short_s)
    # Only the tail is scanned: a box buried far earlier is not an answer.
    assert score("\\boxed{13}" + line * 2000, "13") == 0.0


def test_extra_keywords_from_verl_are_accepted():
    assert compute_score("math", "\\boxed{2}", "2", None, reward_router_address=None, my_reward_kwarg=1) == 1.0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from(list("\\boxed{}fbox Answer:#$0123456789.-/^_frac\n")), max_size=200))
def test_random_text_never_raises(no_math_verify, text):
    assert score(text, "12") in (0.0, 1.0)


def test_scores_from_worker_threads_like_verl(monkeypatch):
    """verl 0.9.1 runs compute_score in a thread pool, where math-verify's signal.alarm cannot be used."""
    if not math_reward.MATH_VERIFY_AVAILABLE:
        pytest.skip("math-verify not installed")
    monkeypatch.setattr(math_reward, "MATH_VERIFY_PROCESSES", 2)  # 8 threads share 2 helpers
    monkeypatch.setattr(math_reward, "_pool", None)
    cases = [("\\boxed{3\\sqrt{2}}", "\\sqrt{18}", 1.0), ("\\boxed{2\\sqrt{2}}", "\\sqrt{18}", 0.0)] * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda c: score(c[0], c[1]), cases))
    assert results == [c[2] for c in cases]


def test_math_verify_timeout_scores_zero_and_helper_recovers(monkeypatch):
    """The helper's own alarm ends a runaway comparison (the helper lives on); the parent's backstop kills one
    that overruns anyway. Asserted by which process answers, not by wall time (CI timed 6.6 s on a loaded machine
    for a fresh helper's imports plus the 1 s alarm)."""
    if not math_reward.MATH_VERIFY_AVAILABLE:
        pytest.skip("math-verify not installed")
    monkeypatch.setattr(math_reward, "MATH_VERIFY_TIMEOUT_S", 1)
    monkeypatch.setattr(math_reward, "MATH_VERIFY_PROCESSES", 1)
    monkeypatch.setattr(math_reward, "_pool", None)  # a fresh helper with the 1 s alarm
    monkeypatch.setattr(math_reward, "_REQUEST_TIMEOUT_S", 120)  # the backstop stays out of the first part

    def helper():
        (proc,) = math_reward._pool._slots.queue
        return proc

    assert score("\\boxed{3\\sqrt{2}}", "\\sqrt{18}") == 1.0  # math-verify's case: starts the helper
    first = helper()
    assert score("\\boxed{9^{9^{9}}}", "1") == 0.0  # sympy would take forever; math-verify's alarm stops it
    assert helper() is first and first.poll() is None
    # The parent-side backstop kills a helper that overruns; the next request gets a new helper.
    monkeypatch.setattr(math_reward, "_REQUEST_TIMEOUT_S", 0.2)
    assert score("\\boxed{9^{9^{9}}}", "1") == 0.0
    assert helper() is None and first.poll() is not None
    monkeypatch.setattr(math_reward, "_REQUEST_TIMEOUT_S", 30)
    assert score("\\boxed{2\\sqrt{2}}", "\\sqrt{8}") == 1.0
    assert helper() not in (None, first)


def test_imports_and_scores_without_math_verify():
    code = (
        "import sys; sys.modules['math_verify'] = None\n"
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(REPO / 'reward' / 'math_reward.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert m.MATH_VERIFY_AVAILABLE is False\n"
        "print(m.compute_score('d', 'so \\\\boxed{\\\\dfrac{1}{2}}', '0.5'),"
        " m.compute_score('d', '\\\\boxed{3}', '4'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1.0", "0.0"]
