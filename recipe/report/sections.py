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


def section_main(doc: str, section, start: str, end: str, heading: str, argv: list[str] | None = None,
                 add_arguments=None) -> int:
    """The command line of a bench script that prints one results section and, with ``--results PATH``, writes it
    between its markers there (``section()`` computes the text; with ``add_arguments(parser)`` for the script's own
    options, ``section(args)``)."""
    import argparse
    import sys
    import time

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if add_arguments is not None:
        add_arguments(ap)
    ap.add_argument("--results", metavar="PATH", help="write the section into this markdown file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    text = section(args) if add_arguments is not None else section()
    print(text)
    if args.results:
        write_section(Path(args.results), start, end, heading, text)
    print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0
