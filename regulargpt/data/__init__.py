"""Data: corpora → sentencepiece tokenizer → flat token shards + manifest, and reading them for training/evaluation.

Build a folder with `python data_prep/prepare.py --source python-stdlib --out data/stdlib` (see docs/DATA.md), then:

    from regulargpt.data import open_split, WindowSampler
    train = open_split("data/stdlib", "train", vocab_size=8000)
    batch = WindowSampler(train, seq_len=512, micro_batch_size=8, seed=0).batch(step=0)  # (8, 513)
"""
from regulargpt.data.sampler import WindowSampler
from regulargpt.data.shards import prepare
from regulargpt.data.token_split import TokenSplit, check_tokenizer, load_manifest, open_split
from regulargpt.data.sources import DataError, resolve_source
from regulargpt.data.tokenizer import Tokenizer, train_tokenizer

__all__ = [
    "DataError",
    "Tokenizer",
    "TokenSplit",
    "WindowSampler",
    "check_tokenizer",
    "load_manifest",
    "open_split",
    "prepare",
    "resolve_source",
    "train_tokenizer",
]
