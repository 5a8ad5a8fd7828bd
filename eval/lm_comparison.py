"""``python eval/lm_comparison.py`` = the ``regulargpt-lm-comparison`` console script (``make demo`` runs it with
--demo); the command and its usage are in :mod:`regulargpt.commands.lm_comparison`, the studies in
:mod:`regulargpt.experiments.lm_comparison` (a thin wrapper, so every documented command keeps working from a
checkout)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`

from regulargpt.cli import run  # noqa: E402
from regulargpt.commands.lm_comparison import main  # noqa: E402

if __name__ == "__main__":
    run(main)
