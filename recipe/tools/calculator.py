"""Exact arithmetic for GSM8K-style tool calls: a tokenizer and a recursive-descent parser over ``Fraction``.

Never ``eval``: the expression is tokenized and parsed here, every number is an exact ``Fraction`` (``0.1 + 0.2`` is
``3/10``), and only the operations below exist. Inputs that could exhaust the host are refused with a named error
(``CalculatorError``): expressions over ``MAX_EXPRESSION_CHARS``, nesting deeper than ``MAX_DEPTH``, exponents over
``MAX_EXPONENT`` and results over ``MAX_RESULT_BITS`` (numerator or denominator).

Grammar (usual precedence, ``^`` and ``**`` right-associative and binding tighter than unary minus, ``-2^2 = -4``)::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/" | "//" | "%" | "mod") unary)*
    unary   := ("+" | "-") unary | power
    power   := postfix (("^" | "**") unary)?
    postfix := atom "%"?                      # 15% = 15/100, where no operand follows the "%" (else modulo)
    atom    := NUMBER | CONSTANT | FUNC "(" expr ("," expr)* ")" | "(" expr ")"

Functions: ``sqrt abs round floor ceil min max``; constants ``pi e`` (inexact). ``sqrt`` of a perfect square and
integer powers are exact; ``sqrt`` otherwise, fractional powers and the constants are computed with ``Decimal`` at
``DECIMAL_DIGITS`` digits and the result is marked inexact (printed with ``≈``), as is every result computed from an
inexact value (``floor(sqrt(2))`` is ``≈ 1``). ``$`` and thousands separators ``1,234,567`` (groups of three
digits, only in expressions without a function call, where "," separates arguments) are accepted; ``round`` rounds
half away from zero as people do (``round(0.125, 2)`` is ``0.13``), not to even as Python's; ``×`` ``÷`` ``−`` are
read as ``* / -``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

MAX_EXPRESSION_CHARS = 2000
MAX_DEPTH = 60
MAX_EXPONENT = 4096
MAX_RESULT_BITS = 4096
DECIMAL_DIGITS = 30
# Up to this many digits after the point a terminating decimal is printed in full; longer ones are rounded (≈).
MAX_PRINTED_DECIMALS = 20


class CalculatorError(ValueError):
    """A clear, model-facing error: bad syntax, division by zero, or a limit."""


@dataclass(frozen=True)
class Value:
    """An exact rational, or an approximation of a real number (``exact=False``) from sqrt/roots/constants."""

    q: Fraction
    exact: bool = True


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+\.\d*|\.\d+|\d+)(?P<exp>[eE][+-]?\d+)? |
        (?P<name>[A-Za-z_][A-Za-z_0-9]*) |
        (?P<op>\*\*|//|[-+*/%^(),])
    )""",
    re.VERBOSE,
)
_TOKEN_NO_GROUPING = re.compile(_TOKEN.pattern.replace(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?|", ""), re.VERBOSE)
_CALL = re.compile(r"[A-Za-z_][A-Za-z_0-9]*\s*\(")
_FUNCS = {"sqrt": 1, "abs": 1, "round": (1, 2), "floor": 1, "ceil": 1, "min": None, "max": None}
_CONSTS = {"pi", "e"}
_TRANSLATE = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-", "$": " ", "\u00a0": " "})


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    # Thousands separators only where no function call could make "," an argument separator: max(1,234) is two args.
    grouping = _CALL.search(text) is None
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = (_TOKEN if grouping else _TOKEN_NO_GROUPING).match(text, pos)
        if m is None or m.end() == pos:
            bad = text[pos:].lstrip()[:1]
            where = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
            raise CalculatorError(f"unexpected character {bad!r} at position {where}")
        if m.group("num"):
            raw = m.group("num").replace(",", "")
            exp = m.group("exp")
            if exp and abs(int(exp[1:])) > MAX_EXPONENT:
                raise CalculatorError(f"number exponent too large (limit {MAX_EXPONENT})")
            tokens.append(("num", raw + (exp or ""), m.start("num")))
        elif m.group("name"):
            tokens.append(("name", m.group("name").lower(), m.start("name")))
        else:
            tokens.append(("op", m.group("op"), m.start("op")))
        pos = m.end()
    return tokens


def _check_size(q: Fraction) -> Fraction:
    if q.numerator.bit_length() > MAX_RESULT_BITS or q.denominator.bit_length() > MAX_RESULT_BITS:
        raise CalculatorError(f"number too large (limit {MAX_RESULT_BITS} bits)")
    return q


def _decimal(q: Fraction) -> Decimal:
    return Decimal(q.numerator) / Decimal(q.denominator)


class _Parser:
    def __init__(self, tokens: list[tuple[str, str, int]]):
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None:
            raise CalculatorError("unexpected end of expression" + (f": expected {value!r}" if value else ""))
        if value is not None and tok[1] != value:
            raise CalculatorError(f"expected {value!r} at position {tok[2]}, got {tok[1]!r}")
        self.i += 1
        return tok

    def at(self, *values: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] in ("op", "name") and tok[1] in values

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalculatorError(f"expression nested too deeply (limit {MAX_DEPTH})")

    def expr(self) -> Value:
        self.enter()
        left = self.term()
        while self.at("+", "-"):
            op = self.take()[1]
            right = self.term()
            q = left.q + right.q if op == "+" else left.q - right.q
            left = Value(_check_size(q), left.exact and right.exact)
        self.depth -= 1
        return left

    def term(self) -> Value:
        left = self.unary()
        while self.at("*", "/", "//", "%", "mod"):
            op = self.take()[1]
            right = self.unary()
            exact = left.exact and right.exact
            if op == "*":
                left = Value(_check_size(left.q * right.q), exact)
                continue
            if right.q == 0:
                raise CalculatorError("division by zero" if op in ("/", "//") else "modulo by zero")
            if op == "/":
                left = Value(_check_size(left.q / right.q), exact)
            elif op == "//":
                left = Value(Fraction(left.q // right.q), exact)
            else:
                left = Value(_check_size(left.q % right.q), exact)
        return left

    def unary(self) -> Value:
        if self.at("+", "-"):
            op = self.take()[1]
            self.enter()
            v = self.unary()
            self.depth -= 1
            return v if op == "+" else Value(-v.q, v.exact)
        return self.power()

    def power(self) -> Value:
        base = self.postfix()
        if self.at("^", "**"):
            self.take()
            self.enter()
            exp = self.unary()
            self.depth -= 1
            return _pow(base, exp)
        return base

    def postfix(self) -> Value:
        v = self.atom()
        # "%" is a percent sign unless an operand follows it (a number, a name or "("): "15% * 3" and "(1+50%)"
        # are percents, "10 % 3" is modulo. "7 % -3" reads as a percent too: write "7 mod -3".
        if self.at("%"):
            nxt = self.tokens[self.i + 1] if self.i + 1 < len(self.tokens) else None
            if nxt is None or (nxt[0] == "op" and nxt[1] != "("):
                self.take()
                return Value(v.q / 100, v.exact)
        return v

    def atom(self) -> Value:
        tok = self.take()
        kind, text, pos = tok
        if kind == "num":
            try:
                return Value(_check_size(Fraction(text)))
            except (ValueError, ZeroDivisionError) as e:
                raise CalculatorError(f"bad number {text!r} at position {pos}") from e
        if kind == "op" and text == "(":
            v = self.expr()
            self.take(")")
            return v
        if kind == "name":
            if text in _CONSTS:
                with localcontext() as ctx:
                    ctx.prec = DECIMAL_DIGITS
                    d = Decimal(1).exp() if text == "e" else Decimal("3.14159265358979323846264338327950288")
                    return Value(Fraction(+d), exact=False)
            if text in _FUNCS:
                return self.call(text, pos)
            raise CalculatorError(
                f"unknown name {text!r} at position {pos} (functions: {', '.join(sorted(_FUNCS))}; constants: pi, e)"
            )
        raise CalculatorError(f"unexpected {text!r} at position {pos}")

    def call(self, name: str, pos: int) -> Value:
        self.take("(")
        args = [self.expr()]
        while self.at(","):
            self.take()
            args.append(self.expr())
        self.take(")")
        arity = _FUNCS[name]
        ok = arity is None or (len(args) in arity if isinstance(arity, tuple) else len(args) == arity)
        if not ok:
            raise CalculatorError(f"{name}() takes {arity} argument(s), got {len(args)}")
        exact = all(a.exact for a in args)
        x = args[0].q
        if name == "abs":
            return Value(abs(x), exact)
        if name == "floor":
            return Value(Fraction(math.floor(x)), exact)
        if name == "ceil":
            return Value(Fraction(math.ceil(x)), exact)
        if name == "min":
            return min(args, key=lambda a: a.q)
        if name == "max":
            return max(args, key=lambda a: a.q)
        if name == "round":
            nd = 0
            if len(args) == 2:
                if args[1].q.denominator != 1 or abs(args[1].q) > 100:
                    raise CalculatorError("round(x, n): n must be an integer between -100 and 100")
                nd = int(args[1].q)
            # Half away from zero (round(2.5) = 3, as people round), not Python's half to even.
            scale = Fraction(10) ** nd
            r = math.floor(abs(x) * scale + Fraction(1, 2)) / scale
            return Value(r if x >= 0 else -r, exact)
        # sqrt
        return _root(args[0], 2)


def _root(v: Value, n: int) -> Value:
    """The real n-th root; exact when v is a perfect n-th power of a rational."""
    x = v.q
    if x < 0 and n % 2 == 0:
        raise CalculatorError("square root of a negative number" if n == 2 else "even root of a negative number")
    sign = -1 if x < 0 else 1
    x = abs(x)
    num, den = _iroot(x.numerator, n), _iroot(x.denominator, n)
    if num is not None and den is not None:
        return Value(sign * Fraction(num, den), v.exact)
    with localcontext() as ctx:
        ctx.prec = DECIMAL_DIGITS + 5
        d = _decimal(x)
        r = d.sqrt() if n == 2 else (d.ln() / n).exp()
        ctx.prec = DECIMAL_DIGITS
        return Value(sign * Fraction(+r), exact=False)


def _iroot(k: int, n: int) -> int | None:
    r = math.isqrt(k) if n == 2 else round(k ** (1.0 / n)) if k.bit_length() < 1000 else None
    if r is None:
        return None
    for c in (r - 1, r, r + 1):
        if c >= 0 and c**n == k:
            return c
    return None


def _pow(base: Value, exp: Value) -> Value:
    e = exp.q
    exact = base.exact and exp.exact
    if e.denominator == 1:
        k = int(e)
        if abs(k) > MAX_EXPONENT:
            raise CalculatorError(f"exponent too large (limit {MAX_EXPONENT})")
        if base.q == 0 and k < 0:
            raise CalculatorError("division by zero (0 to a negative power)")
        # Size check before computing: bits(base^k) ~ |k| * bits(base).
        bits = max(base.q.numerator.bit_length(), base.q.denominator.bit_length())
        if bits * abs(k) > MAX_RESULT_BITS + 64:
            raise CalculatorError(f"number too large (limit {MAX_RESULT_BITS} bits)")
        return Value(_check_size(base.q**k), exact)
    # Fractional exponent p/q: the q-th root, then the p-th power.
    if e.denominator > 1000 or abs(e.numerator) > MAX_EXPONENT:
        raise CalculatorError("exponent too complex")
    root = _root(base, e.denominator)
    return _pow(Value(root.q, root.exact and exact), Value(Fraction(e.numerator)))


def evaluate(expression: str) -> Value:
    """Parse and evaluate ``expression`` exactly; raises ``CalculatorError`` with a model-readable reason."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression too long ({len(expression)} characters, limit {MAX_EXPRESSION_CHARS})")
    text = expression.translate(_TRANSLATE).strip()
    if text.endswith("="):
        text = text[:-1]
    if not text.strip():
        raise CalculatorError("empty expression")
    parser = _Parser(_tokenize(text))
    value = parser.expr()
    extra = parser.peek()
    if extra is not None:
        raise CalculatorError(f"unexpected {extra[1]!r} at position {extra[2]}")
    return value


def format_value(v: Value) -> str:
    """Integers as integers, terminating decimals in full, other rationals as ``a/b ≈ decimal``; ``≈`` if inexact"""
    q = v.q
    if q.denominator == 1:
        s = str(q.numerator)
        return s if v.exact else f"≈ {s}"
    den = q.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    places = max(twos, fives)
    if den == 1 and places <= MAX_PRINTED_DECIMALS:
        s = _fixed(q, places)
        return s if v.exact else f"≈ {s}"
    approx = _fixed(q, 12).rstrip("0").rstrip(".")
    if v.exact:
        return f"{q.numerator}/{q.denominator} ≈ {approx}"
    return f"≈ {_fixed(q, 15).rstrip('0').rstrip('.')}"


def _fixed(q: Fraction, places: int) -> str:
    scaled = round(q * 10**places)
    sign = "-" if scaled < 0 else ""
    digits = str(abs(scaled)).rjust(places + 1, "0")
    if places == 0:
        return sign + digits
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def calculate(expression: str) -> str:
    """The calculator tool's answer text: the formatted value, or ``Error: <reason>``."""
    try:
        return format_value(evaluate(expression))
    except CalculatorError as e:
        return f"Error: {e}"
    except RecursionError:
        return f"Error: expression nested too deeply (limit {MAX_DEPTH})"


# The OpenAI function schema of the calculator tool: what verl's ToolAgentLoop puts in the prompt's tools list
# (recipe/tools/verl_tools.py) and what the tiny SFT model was trained with (recipe/tiny/tasks.py).
CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression exactly. Supports + - * / // % ^ (power), parentheses, percentages "
            "(15%), sqrt, abs, round, floor, ceil, min, max. Returns the exact result."
        ),
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (48 - 12) * 3 / 4"}},
            "required": ["expression"],
        },
    },
}
