"""``python -m recipe.report RUN_A RUN_B [--out DIR] [--names A,B]``."""
import sys

from recipe.report.cli import main

sys.exit(main())
