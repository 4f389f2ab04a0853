"""What the docs point at exists: the repository's paths they name, and the commits they cite.

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
