"""EXPERIMENT_NAME's documented default (its knob's ``default_doc``, the row of docs/training.md's table) names every
variant the code builds, in the code's order, and nothing the code never builds; docs/training.md's prose names only
documented ones. The settings grid runs the preflight's own parser, so the computed default is what a launch gets."""
import itertools
import json
import re
from pathlib import Path

import pytest

from recipe.preflight.env import parse_env
from recipe.preflight.knobs import KNOBS

REPO = Path(__file__).resolve().parents[2]
DOC = next(k for k in KNOBS if k.env == "EXPERIMENT_NAME").default_doc

# every variable _experiment_name reads, with values that reach each of its branches
ARMS = [{}, {"BASELINE_NO_RESAMPLE": "1"}, {"VLLM_EAGER_BASELINE_NO_RESAMPLE": "1"}]
CAPS = [{}, {"VLLM_ROLLOUT_EARLY_STOP_ENABLE": "0"}, {"VLLM_ROLLOUT_EARLY_STOP_MODE": "calibrated"},
        {"VLLM_ROLLOUT_EARLY_STOP_MODE": "budget"}]
WARM = [{}, {"SAMPLER_INIT_FROM": "/runs/earlier"}, {"SAMPLER_PRIOR_COLUMN": "expected_len"}]
FLAGS = [{}, {"OVER_SAMPLE_ENABLE": "1"}, {"TAIL_CUT_ENABLE": "1"}, {"OVER_SAMPLE_ENABLE": "1", "TAIL_CUT_ENABLE": "1"}]
SPEC = [{}, {"ROLLOUT_SPECULATIVE": "ngram"}, {"ROLLOUT_SPECULATIVE": "suffix"}, {"ROLLOUT_SPECULATIVE": "group"}]
TOOLS = [{}, {"MULTI_TURN": "1"}]
REPLAY = [{}, {"ROUTER_REPLAY": "off"}, {"ROUTER_REPLAY": "R2"}, {"ROUTER_REPLAY": "R3"}]


def documented_tokens(doc: str) -> tuple[list[str], list[str]]:
    """(the base variants, the suffixes in documented order) from the backticked names of ``doc``."""
    names = [t for t in re.findall(r"`([^`]+)`", doc) if "<" not in t and "-grpo-" not in t]  # not the examples
    return [t for t in names if not t.startswith("-")], [t for t in names if t.startswith("-")]


def decompose(variant: str, bases: list[str], suffixes: list[str]) -> list[str] | None:
    """``variant`` as one base then documented suffixes in their documented order (longest match first), or None."""
    for base in sorted(bases, key=len, reverse=True):
        if not variant.startswith(base):
            continue
        rest, parts, after = variant[len(base):], [base], -1
        while rest:
            fits = [(i, s) for i, s in enumerate(suffixes) if i > after and rest.startswith(s)]
            if not fits:
                break
            after, s = max(fits, key=lambda f: len(f[1]))
            parts.append(s)
            rest = rest[len(s):]
        if not rest:
            return parts
    return None


@pytest.fixture(scope="module")
def names(tmp_path_factory):
    """EXPERIMENT_NAME over the whole grid, for a Mixture-of-Experts MODEL_PATH (its ROUTER_REPLAY default is R3)."""
    model = tmp_path_factory.mktemp("models") / "Qwen3-30B-A3B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_experts": 128}))
    out = []
    for parts in itertools.product(ARMS, CAPS, WARM, FLAGS, SPEC, TOOLS, REPLAY):
        env = {"MODEL_PATH": str(model)}
        for p in parts:
            env.update(p)
        values, _ = parse_env(env)  # the missing DISTCP_PATH etc. are errors; the name is computed all the same
        out.append(values["EXPERIMENT_NAME"])
    return out


PREFIX = "qwen3-30b-a3b-grpo-"


def test_every_name_the_code_builds_is_documented_in_order(names):
    bases, suffixes = documented_tokens(DOC)
    assert bases and suffixes, f"EXPERIMENT_NAME's default_doc lists no variants: {DOC!r}"
    wrong = sorted({n for n in names if not n.startswith(PREFIX) or decompose(n[len(PREFIX):], bases, suffixes) is None},
                   key=len)
    assert not wrong, (f"{len(wrong)} names EXPERIMENT_NAME's default_doc does not describe (or in another order), "
                       f"e.g. {wrong[:5]}; documented: {bases} then {suffixes}")


def test_every_documented_variant_is_built(names):
    bases, suffixes = documented_tokens(DOC)
    used = {part for n in names for part in decompose(n[len(PREFIX):], bases, suffixes) or []}
    assert set(bases + suffixes) <= used, f"documented but never built: {sorted(set(bases + suffixes) - used)}"


def test_the_guide_names_only_documented_variants():
    """docs/training.md's prose (``...-grpo-baseline-eager``, ``-budgetcap``, ``...-warm``: an arm named by its end)
    and its generated table."""
    text = (REPO / "docs" / "training.md").read_text()
    bases, suffixes = documented_tokens(DOC)
    assert DOC in text, "regenerate docs/training.md's table: python -m recipe.preflight --env-table"
    cited = [re.sub(r"^.*grpo-", "", t.removeprefix("...")).strip("/-")
             for t in re.findall(r"`((?:\.\.\.)?-[a-z][a-z0-9-]*|[\w./-]*-grpo-[a-z0-9-]+/?)`", text)]
    assert len(cited) >= 8, cited  # the arms the guide names (baseline, baseline-eager, -nocap, -calcap, ...)
    for token in cited:
        fits = [decompose(base + "-" + token, bases, suffixes) for base in ("resampler", "baseline")]
        assert decompose(token, bases, suffixes) or any(fits), \
            f"docs/training.md names a run-name variant the code does not build: {token}"


def test_decompose_refuses_a_wrong_order_and_an_unknown_suffix():
    bases, suffixes = ["baseline", "baseline-eager", "resampler"], ["-nocap", "-warm", "-os", "-group", "-tools"]
    assert decompose("baseline-eager-group-tools", bases, suffixes) == ["baseline-eager", "-group", "-tools"]
    assert decompose("resampler-nocap-warm-os", bases, suffixes) == ["resampler", "-nocap", "-warm", "-os"]
    assert decompose("resampler-os-warm", bases, suffixes) is None
    assert decompose("resampler-tailcut", bases, suffixes) is None
