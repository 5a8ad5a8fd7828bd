"""The command that rebuilds a data folder, as every error that asks for a re-prepare prints it.

It keeps the folder's tokenizer: whenever the folder holds its tokenizer file (or its manifest names one), the
command passes ``--tokenizer DIR/tokenizer.model``, so following it never trains a new tokenizer over the one the
folder's runs were trained with. With a manifest, the source and the options that decide the content (text field,
max bytes, seed, split fractions) come from it, each stated, and ``--force`` rebuilds a folder whose manifest says
it is up to date (its files no longer are). Paths are quoted for the shell (``shlex``).

Example: ``data/tiny`` prepared with ``--vocab-size 512 --max-bytes 300000`` →

    python data_prep/prepare.py --source python-stdlib --out data/tiny --tokenizer data/tiny/tokenizer.model \\
        --text-field text --max-bytes 300000 --seed 0 --val-fraction 0.05 --test-fraction 0.05 --force
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

__all__ = ["reprepare_command"]

_TOKENIZER_FILE = "tokenizer.model"
# the manifest's options (shards.prepare's) that are flags of data_prep/prepare.py and decide what is written
_CONTENT_OPTIONS = ("text_field", "max_bytes", "seed", "val_fraction", "test_fraction")


def _option_flags(options: dict[str, Any]) -> list[str]:
    """`--flag value` for every manifest option that decides the content, in the manifest's order (None: left
    out; ``vocab_size`` too: the tokenizer is given)."""
    flags: list[str] = []
    for key, value in options.items():
        if key in _CONTENT_OPTIONS and value is not None:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def _section(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    value = manifest.get(key)
    return value if isinstance(value, dict) else {}


def reprepare_command(data_dir: str | Path, manifest: dict[str, Any] | None = None, source: str = "python-stdlib",
                      vocab_size: int | None = None) -> str:
    """The prepare.py command that rebuilds `data_dir` with its own tokenizer.

    `manifest`: the folder's (validated) manifest; its source spec and options are used and ``--force`` is added.
    Without one (missing or unreadable), `source` is the guess to print, ``--tokenizer`` is passed when the folder
    holds ``tokenizer.model``, else ``--vocab-size`` when `vocab_size` is given.
    """
    data_dir = Path(data_dir)
    tokenizer_file = _TOKENIZER_FILE
    if manifest is not None:
        source = str(_section(manifest, "source").get("spec", source))
        tokenizer_file = str(_section(manifest, "tokenizer").get("file", _TOKENIZER_FILE))
    args = ["python", "data_prep/prepare.py", "--source", source, "--out", str(data_dir)]
    if manifest is not None or (data_dir / tokenizer_file).is_file():
        args += ["--tokenizer", str(data_dir / tokenizer_file)]
    elif vocab_size:
        args += ["--vocab-size", str(vocab_size)]
    if manifest is not None:
        args += _option_flags(_section(manifest, "options")) + ["--force"]
    return shlex.join(args)
