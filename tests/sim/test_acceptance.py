"""recipe.sim.acceptance: the walk on hand-built responses with known answers, vLLM's ngram rule, the sources'
knowledge (lockstep siblings, earlier epochs), the bootstrap, the CLI and its errors."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recipe.sim.acceptance import (SHIPPED_NGRAM, Drafter, Group, estimate, group_from_record, load_groups,
                                   walk_groups)

ROOT = Path(__file__).resolve().parents[2]


def one(group_or_groups, drafter):
    groups = group_or_groups if isinstance(group_or_groups, list) else [group_or_groups]
    return estimate(groups, [drafter], boot=50)[Drafter.parse(drafter).name]


def walks(groups, drafter):
    d = Drafter.parse(drafter)
    return [ws for _, ws in walk_groups(groups, [d])[d.name]]


def test_response_that_repeats_the_prompt():
    # t=0: prefill, 1 token, no draft. t=1: context ends "1" -> its earliest occurrence (prompt[0]) is followed by
    # 2 3 4 5: all four accepted, 5 tokens. t=6: "4 5 6" -> 7 8 9 10, the response's last 4: accepted, cut there.
    g = Group("a", np.arange(1, 11), (np.arange(1, 11),))
    (w,), = walks([g], "ngram:k=4:min=1:max=3")
    assert w.start.tolist() == [0, 1, 6] and w.emitted.tolist() == [1, 5, 4]
    assert w.drafted.tolist() == [0, 4, 4] and w.accepted.tolist() == [0, 4, 4]
    s = one(g, "ngram:k=4:min=1:max=3")
    assert s["tokens_per_step"] == pytest.approx(10 / 3, abs=1e-4) and s["acceptance_length"] == pytest.approx(5.0)
    # an off-by-one walk (advance by m, or draft from the context less its last token) gives other steps
    assert s["steps"] == 3 and s["drafts"] == 2 and s["accepted"] == 8


def test_no_repeats_gives_one_token_per_step():
    g = Group("a", np.array([1000]), (np.arange(1, 200), np.arange(300, 500)))
    for d in ("ngram", "ngram:k=4:min=5:max=5", "suffix:own", "suffix:group", "suffix:own+group"):
        s = one(g, d)
        assert s["tokens_per_step"] == 1.0 and s["drafts"] == 0 and s["tokens_per_step_ci"] == [1.0, 1.0]


def test_vllm_ngram_rule_longest_n_then_earliest_occurrence():
    # t=1: the context ends "8 1": no earlier "8 1"; "1" at its earliest occurrence (prompt[1]) is followed by
    # 2 9 1 2, all matching (a later occurrence, prompt[4], would draft 2 3 8 1: one match)
    prompt = np.array([7, 1, 2, 9, 1, 2, 3, 8])
    resp = np.array([1, 2, 9, 1, 2, 3])
    (w,), = walks([Group("a", prompt, (resp,))], "ngram:k=4:min=1:max=3")
    assert w.start.tolist() == [0, 1] and w.accepted.tolist() == [0, 4] and w.emitted.tolist() == [1, 5]
    # the longest n first: at t=2 the context ends "1 2"; "1 2" (n=2, followed by 3 4 1 2) beats the earlier "2"
    # (n=1, followed by 9 5 1 6)
    (w,), = walks([Group("a", np.array([2, 9, 5, 1, 6, 7, 1, 2, 3, 4]), (np.array([1, 2, 3, 4, 8]),))],
                  "ngram:k=4:min=1:max=3")
    assert w.start.tolist() == [0, 1, 2] and w.accepted.tolist() == [0, 0, 2]
    # min=max=5 (vLLM's default): the only 5-gram seen twice is "1 2 9 1 2" (t=5), followed by 3 8 1 2: one
    s = one(Group("a", prompt, (resp,)), "ngram:k=4:min=5:max=5")
    assert (s["drafts"], s["draft_tokens"], s["accepted"]) == (1, 4, 1)
    # the draft stops at the context's end: "5 5" at the end of "5 5 5" matches at 0, followed by one known token
    (w,), = walks([Group("a", np.array([5, 5]), (np.array([5, 5, 5, 5]),))], "ngram:k=4:min=1:max=2")
    assert w.drafted[1] == 1  # context 5 5 5: the 2-gram's earliest occurrence ends at 1, one token (5) after it


def test_group_siblings_in_lockstep():
    r = np.arange(10, 50)
    # identical siblings in lockstep: neither knows a token the other has not emitted yet, so nothing to draft
    assert one(Group("a", np.array([1]), (r, r.copy())), "suffix:group")["drafts"] == 0
    # a sibling 3 tokens ahead (the other starts with 3 extra tokens): the lagging one drafts up to 3 known tokens
    lag = np.concatenate([[90, 91, 92], r])
    (w_lead, w_lag), = walks([Group("a", np.array([1]), (r, lag))], "suffix:group")
    assert w_lead.accepted.sum() == 0
    assert w_lag.drafted.max() == 3 and (w_lag.accepted[w_lag.drafted > 0] == 3).all()
    # a finished sibling is known in full: a short one that the long one repeats later
    short = r[:10]
    (w_short, w_long), = walks([Group("a", np.array([1]), (short, np.concatenate([r[20:30], short])))],
                               "suffix:group")
    assert w_long.accepted.sum() > 0


def test_history_is_known_in_full_and_only_earlier_epochs():
    r = np.arange(10, 50)
    e0, e1 = Group("p", np.array([1]), (r,), epoch=0), Group("p", np.array([1]), (r.copy(),), epoch=1)
    s = one([e0, e1], "suffix:history")
    assert s["groups"] == 1  # epoch 0 has no history, so it is not reported
    # t=0 prefill; then the whole response, 4 + 1 tokens a step (k=4): 1 + ceil(39 / 5) steps
    assert s["steps"] == 1 + 8 and s["tokens"] == 40
    other = Group("q", np.array([1]), (r.copy(),), epoch=1)  # another prompt's history is not used
    assert estimate([e0, other], ["suffix:history"])["suffix:history:k=4:depth=24:min=1"]["groups"] == 0


def test_longest_match_wins_across_sources():
    # own context offers a 1-token match with a wrong continuation, the earlier epoch a long one with the right one
    hist = np.array([20, 21, 22, 23, 24, 25, 26, 27])
    cur = np.array([20, 21, 22, 23, 24, 25, 26, 27])
    prompt = np.array([1, 21, 99])
    e0, e1 = Group("p", prompt, (hist,), 0), Group("p", prompt, (cur,), 1)
    own = one([e0, e1], "suffix:own")
    both = one([e0, e1], "suffix:own+history")
    assert both["tokens_per_step"] > own["tokens_per_step"]


def test_bootstrap_interval_covers_and_is_over_groups():
    rng = np.random.default_rng(0)
    groups = []
    for p in range(30):
        base = rng.integers(0, 50, 40)
        groups.append(Group(str(p), base, tuple(np.concatenate([base[rng.integers(0, 30):][:10],
                                                                 rng.integers(0, 500, 30)]) for _ in range(4))))
    s = one(groups, "ngram:k=4:min=1:max=3")
    lo, hi = s["tokens_per_step_ci"]
    assert lo < s["tokens_per_step"] < hi
    assert sum(b["steps"] for b in s["by_position"]) == s["steps"]


def test_shipped_ngram_is_the_knobs_default():
    from recipe.preflight.knobs import KNOBS

    by = {k.env: k for k in KNOBS}
    assert SHIPPED_NGRAM == {"k": int(by["ROLLOUT_SPECULATIVE_TOKENS"].default),
                             "min": int(by["ROLLOUT_SPECULATIVE_NGRAM_MIN"].default),
                             "max": int(by["ROLLOUT_SPECULATIVE_NGRAM_MAX"].default)}
    assert Drafter.parse("ngram") == Drafter()


def test_drafter_specs_and_bad_input():
    assert Drafter.parse("suffix:own+group:k=6:depth=12").name == "suffix:own+group:k=6:depth=12:min=1"
    for bad, word in (("suffix", "sources"), ("suffix:own:max=3", "depth="), ("ngram:depth=3", "max="),
                      ("ngram:k=x", "integer"), ("suffix:own+cousins", "sources"), ("eagle", "kind")):
        with pytest.raises(ValueError, match=word):
            Drafter.parse(bad)
    with pytest.raises(ValueError, match="responses"):
        group_from_record({"prompt_id": 1, "prompt": [1]})


def test_cli(tmp_path):
    path = tmp_path / "groups.jsonl"
    path.write_text("\n".join(json.dumps({"prompt_id": f"p{i}", "prompt": list(range(1, 11)),
                                          "responses": [list(range(1, 11))] * 2}) for i in range(3)) + "\n")
    assert len(load_groups(path)) == 3
    out = subprocess.run([sys.executable, "-m", "recipe.sim.acceptance", str(path), "--json", "--drafter",
                          "ngram:k=4:min=1:max=3", "--drafter", "suffix:own+group", "--bootstrap", "100"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["ngram:k=4:min=1:max=3"]["tokens_per_step"] == pytest.approx(10 / 3, abs=1e-4)
    assert rep["ngram:k=4:min=1:max=3"]["by_position"][0]["from"] == 0
    table = subprocess.run([sys.executable, "-m", "recipe.sim.acceptance", str(path)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 0 and "| `ngram:k=4:min=5:max=5` |" in table.stdout
    path.write_text('{"prompt_id": "x", "prompt": [1], "responses": "abc"}\n')
    bad = subprocess.run([sys.executable, "-m", "recipe.sim.acceptance", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "groups.jsonl:1" in bad.stderr and "responses" in bad.stderr


def test_a_runs_token_records_are_read_in_step_order(tmp_path):
    """RECORD_TOKENS=1's <run>/tokens (recipe/token_record.py): the directory, or one step's .gz, is the input;
    steps in number order (step 10 after step 9), so each prompt's later epoch finds the earlier one as history."""
    from recipe.token_record import TokenRecorder

    rec = TokenRecorder(tmp_path / "tokens", max_bytes=10**6)
    response = list(range(1, 11))
    for step, epoch in ((10, 1), (9, 0)):
        rec.record(step, epoch, rows=[5, 5], sample_index=[1, 0], prompts=[[1, 2]] * 2,
                   responses=[response, [3, 4, 5]])
    groups = load_groups(tmp_path / "tokens")
    assert [(g.prompt_id, g.epoch) for g in groups] == [("5", 0), ("5", 1)]
    assert [r.tolist() for r in groups[0].responses] == [[3, 4, 5], response]  # sample order
    assert [g.epoch for g in load_groups(tmp_path / "tokens" / "step_000010.jsonl.gz")] == [1]
    out = subprocess.run([sys.executable, "-m", "recipe.sim.acceptance", str(tmp_path / "tokens"), "--json",
                          "--drafter", "suffix:history", "--bootstrap", "50"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    hist = json.loads(out.stdout)["suffix:history:k=4:depth=24:min=1"]
    assert hist["groups"] == 1 and hist["accepted"] > 0  # epoch 1 drafted from epoch 0's identical responses
    (tmp_path / "empty").mkdir()
    (tmp_path / "cut.jsonl.gz").write_bytes((tmp_path / "tokens" / "step_000009.jsonl.gz").read_bytes()[:-12])
    for bad, word in ((tmp_path / "empty", "no step_"), (tmp_path / "cut.jsonl.gz", "cut.jsonl.gz:1")):
        with pytest.raises(ValueError, match=word):
            load_groups(bad)
