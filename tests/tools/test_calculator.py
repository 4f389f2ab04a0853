"""The calculator: exact arithmetic by a parser (never eval), clear errors, bounded work on hostile input."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.tools import calculator
from recipe.tools.calculator import CalculatorError, calculate, evaluate


@pytest.mark.parametrize(
    "expr, want",
    [
        ("1+2*3", "7"),
        ("(1+2)*3", "9"),
        ("0.1 + 0.2", "0.3"),  # exact: not 0.30000000000000004
        ("7/3", "7/3 ≈ 2.333333333333"),
        ("10/4", "2.5"),
        ("-2^2", "-4"),
        ("2^3^2", "512"),  # right-associative
        ("2**-2", "0.25"),
        ("15% * 200", "30"),
        ("(1 + 50%) * 10", "15"),
        ("10 % 3", "1"),
        ("-7 mod 3", "2"),
        ("17 // 5", "3"),
        ("$1,234.50 * 2", "2469"),
        ("12 × 3 ÷ 4", "9"),
        ("sqrt(144)", "12"),
        ("sqrt(2)", "≈ 1.414213562373095"),
        ("8^(1/3)", "2"),
        ("abs(-3) + floor(2.7) + ceil(2.1)", "8"),
        ("round(7/3, 2)", "2.33"),
        ("max(1,234)", "234"),  # with a function call "," separates arguments
        ("min(4, 2.5, 3)", "2.5"),
        ("1e3 / 8", "125"),
        ("48/2 + 48 =", "72"),
    ],
)
def test_values(expr, want):
    assert calculate(expr) == want


@pytest.mark.parametrize(
    "expr, message",
    [
        ("1/0", "division by zero"),
        ("5 % 0", "modulo by zero"),
        ("sqrt(-1)", "negative"),
        ("2 +", "unexpected end"),
        ("2 3", "unexpected '3'"),
        ("(1+2", "expected ')'"),
        ("x + 1", "unknown name 'x'"),
        ("__import__(os)", "unknown name '__import__'"),
        ("__import__('os')", "unexpected character"),
        ("1; 2", "unexpected character ';'"),
        ("", "empty expression"),
        ("2^100000", "exponent too large"),
        ("10^4000 * 10^4000", "number too large"),
        ("(" * 500 + "1" + ")" * 500, "nested too deeply"),
        ("-" * 500 + "1", "nested too deeply"),
        ("1+" * 2000 + "1", "expression too long"),
        ("round(1, 1000)", "round(x, n)"),
    ],
)
def test_errors_are_named_never_raised(expr, message):
    out = calculate(expr)
    assert out.startswith("Error: ") and message in out, out


def test_never_eval(monkeypatch):
    """No path of the calculator reaches Python's eval/exec/compile."""
    import builtins

    def boom(*a, **k):
        raise AssertionError("eval/exec/compile called")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, boom)
    assert calculate("2*(3+4)") == "14"
    assert calculate("__import__('os').system('true')").startswith("Error")


@pytest.mark.parametrize(
    "expr, want",
    [
        # Halves away from zero, as the docs promise (half to even would give 2, -2, 0.12, -0.12, 0).
        ("round(2.5)", "3"),
        ("round(-2.5)", "-3"),
        ("round(0.125, 2)", "0.13"),
        ("round(-0.125, 2)", "-0.13"),
        ("round(0.5)", "1"),
        ("round(1.5)", "2"),
        ("round(2.4999)", "2"),
        ("round(1250, -2)", "1300"),
    ],
)
def test_round_takes_halves_away_from_zero(expr, want):
    assert calculate(expr) == want


@pytest.mark.parametrize(
    "expr, want",
    [
        # A function of an approximation is an approximation, even when it prints as an integer.
        ("abs(pi)", "≈ 3.141592653589793"),
        ("-pi", "≈ -3.141592653589793"),
        ("floor(sqrt(2))", "≈ 1"),
        ("ceil(e)", "≈ 3"),
        ("round(pi, 2)", "≈ 3.14"),
        ("max(1, pi)", "≈ 3.141592653589793"),
        ("sqrt(2)^2", "≈ 2"),
        ("floor(sqrt(16))", "4"),  # exact input, exact result
    ],
)
def test_inexact_results_are_marked(expr, want):
    assert calculate(expr) == want
    assert evaluate(expr).exact == (not want.startswith("≈"))


def test_exactness_flag():
    assert evaluate("1/3").exact and evaluate("1/3").q == Fraction(1, 3)
    assert not evaluate("sqrt(2)").exact and not evaluate("pi").exact


def test_value_type_is_exact_fraction():
    with pytest.raises(CalculatorError):
        evaluate(3)  # type: ignore[arg-type]


_ints = st.integers(min_value=-10**6, max_value=10**6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("+-*/"), _ints), min_size=1, max_size=8), _ints)
def test_matches_fraction_reference(ops, first):
    """Any chain of + - * / over integers equals the same computed with Fractions (precedence included)."""
    expr = str(first) + "".join(f" {op} ({n})" for op, n in ops)
    # Reference: * and / bind tighter, left to right; build with Fractions.
    terms, cur = [], Fraction(first)
    for op, n in ops:
        if op in "*/":
            if op == "/" and n == 0:
                assert "division by zero" in calculate(expr)
                return
            cur = cur * n if op == "*" else cur / n
        else:
            terms.append(cur)
            cur = Fraction(n) if op == "+" else -Fraction(n)
    want = sum(terms, Fraction(0)) + cur
    got = evaluate(expr)
    assert got.exact and got.q == want


def test_limits_are_module_constants():
    assert calculator.MAX_EXPRESSION_CHARS >= 1000 and calculator.MAX_DEPTH >= 30
