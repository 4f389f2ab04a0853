"""Regenerated sections of a markdown file (bench/RESULTS.md): a block between two HTML-comment markers is replaced
in place, or appended under ``heading`` the first time, leaving everything else in the file as it was."""
from __future__ import annotations

import re
from pathlib import Path


def write_section(path: Path, start: str, end: str, heading: str, text: str) -> None:
    block = f"{start}\n{text}\n{end}"
    old = path.read_text() if path.exists() else "# Results\n"
    if start in old and end in old:
        new = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, old, flags=re.S)
    else:
        new = old.rstrip("\n") + f"\n\n{heading}\n\n" + block + "\n"
    path.write_text(new)
