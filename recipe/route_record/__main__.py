"""``python -m recipe.route_record OUT_DIR``: record what the R3 replay check reads (:mod:`.record`)."""
from __future__ import annotations

import sys
from pathlib import Path

from .record import __doc__ as RECORD_DOC, record


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(RECORD_DOC.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = record(Path(argv[0]))
    print(f"route_record: {', '.join(sorted(p.name for p in out.iterdir()))} in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
