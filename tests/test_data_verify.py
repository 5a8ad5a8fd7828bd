"""Data verification (issue 37 §1): each level detects what it claims (size: truncation; blocks: damage in a
recorded block; full: damage between blocks), the full check is read once per file version, an old manifest
without block checksums works and says so once, damaged data is refused by evaluation and by a resumed training run
with one line whose re-prepare command (keeping the folder's tokenizer) repairs it. Expected digests are computed
here with hashlib over slices of the bytes written, not by the module."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, ZERO3, fake_data_folder, pretrain_args, pretrain_cmd, run_env

import regulargpt.data.digest_cache as digest_cache
from regulargpt.checkpoint import save_model_file
from regulargpt.config import Config, DataConfig, ModelConfig, TrainConfig
from regulargpt.data import DataError, load_manifest, open_split
from regulargpt.data.reprepare import reprepare_command
from regulargpt.model import build_model
from regulargpt.train.lm_data import open_data

BLOCK = 4096
OFFSETS = [0, 1 << 18, 1 << 19, (1 << 20) - BLOCK]  # 4 recorded blocks of a 1 MiB split


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def synthetic(tmp_path: Path) -> tuple[Path, bytes]:
    """A folder whose 1 MiB test split has block checksums at OFFSETS (blocks of 4 KiB) and its whole sha256."""
    tokens = np.random.default_rng(0).integers(0, 1000, 1 << 19).astype(np.uint16)
    folder = fake_data_folder(tmp_path / "d", {"train": tokens[:100], "val": tokens[:100], "test": tokens}, 1000)
    data = tokens.tobytes()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["splits"]["test"].update(sha256=_sha(data), blocks={
        "block_bytes": BLOCK, "offsets": OFFSETS, "sha256": [_sha(data[o:o + BLOCK]) for o in OFFSETS]})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder, data


def _damage(path: Path, data: bytes, at: int) -> bytes:
    damaged = bytearray(data)
    damaged[at] ^= 0xFF
    path.write_bytes(bytes(damaged))
    return bytes(damaged)


@pytest.mark.parametrize("level", ["size", "blocks", "full"])
def test_every_level_catches_truncation(synthetic: tuple[Path, bytes], level: str) -> None:
    folder, data = synthetic
    (folder / "test.bin").write_bytes(data[:-2])
    with pytest.raises(DataError, match=r"test.bin fails its size check: test.bin holds 524287 tokens \(1048574 "
                                        r"bytes\) but manifest.json expects 524288 tokens"):
        open_split(folder, "test", verify=level)


def test_blocks_catch_damage_in_a_recorded_block_and_size_does_not(synthetic: tuple[Path, bytes]) -> None:
    folder, data = synthetic
    damaged = _damage(folder / "test.bin", data, OFFSETS[1] + 100)
    assert open_split(folder, "test", verify="size").verified == "size"
    for level in ("blocks", "full"):
        with pytest.raises(DataError) as err:
            open_split(folder, "test", verify=level)
        o = OFFSETS[1]
        assert (f"fails its block check: block at offset {o} ({BLOCK} bytes): sha256 expected "
                f"{_sha(data[o:o + BLOCK])[:12]}… got {_sha(damaged[o:o + BLOCK])[:12]}…") in str(err.value)


def test_full_catches_damage_between_blocks(synthetic: tuple[Path, bytes]) -> None:
    folder, data = synthetic
    damaged = _damage(folder / "test.bin", data, 100_000)  # between the blocks at 0 and 262,144
    assert open_split(folder, "test", verify="blocks").verified == "blocks"
    with pytest.raises(DataError, match=f"fails its full sha256 check: sha256 of the whole file expected "
                                        f"{_sha(data)[:12]}… got {_sha(damaged)[:12]}…"):
        open_split(folder, "test", verify="full")


def test_full_reads_a_file_once_per_version(synthetic: tuple[Path, bytes], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    folder, data = synthetic
    path, reads = folder / "test.bin", []
    real = digest_cache.sha256_file
    monkeypatch.setattr(digest_cache, "sha256_file", lambda p: reads.append(Path(p).name) or real(p))

    def new_version(content: bytes) -> None:  # rewritten in place: same inode and size, a later mtime
        path.write_bytes(content)
        later = path.stat().st_mtime_ns + len(reads) * 1_000_000 + 1_000_000
        os.utime(path, ns=(later, later))

    assert open_split(folder, "test", verify="full").verified == "full"
    assert open_split(folder, "test", verify="full").verified == "full"
    assert reads == ["test.bin"]  # the second from the cache
    assert str(path.resolve()) in json.loads((tmp_path / "cache/regulargpt/file_sha256.json").read_text())
    new_version(_damage(path, data, 100_000))
    with pytest.raises(DataError, match="full sha256 check"):
        open_split(folder, "test", verify="full")
    new_version(data)
    assert open_split(folder, "test", verify="full").verified == "full"
    assert reads == ["test.bin"] * 3


def test_a_cache_that_cannot_be_written_costs_only_time(synthetic: tuple[Path, bytes], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    folder, data = synthetic
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    assert open_split(folder, "test", verify="full").verified == "full"
    _damage(folder / "test.bin", data, 100_000)
    with pytest.raises(DataError, match="full sha256 check"):
        open_split(folder, "test", verify="full")


def _copy(data_dir: Path, to: Path, without_blocks: bool = False) -> Path:
    shutil.copytree(data_dir, to)
    if without_blocks:  # a folder prepared before block checksums were recorded
        manifest = json.loads((to / "manifest.json").read_text())
        for info in manifest["splits"].values():
            del info["blocks"]
        (to / "manifest.json").write_text(json.dumps(manifest))
    return to


def _cfg(folder: Path, verify: str = "blocks") -> Config:
    return Config(model=ModelConfig(vocab_size=512), data=DataConfig(path=str(folder), seq_len=32, verify=verify))


def test_an_old_manifest_without_blocks_works_and_says_so_once(data_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(data_dir, tmp_path / "old", without_blocks=True)
    train, val, _ = open_data(_cfg(folder))
    assert (train.verified, val.verified) == ("size", "size")
    [note] = capsys.readouterr().err.splitlines()
    assert note.startswith(f"note: {folder}/manifest.json records no block checksums for its splits")
    assert f"--tokenizer {folder}/tokenizer.model" in note and note.endswith("--force")
    assert open_split(folder, "test", verify="full").verified == "full"  # its sha256 allows the full check
    from regulargpt.evaluation.length_sweep import sweep

    run = _model(folder, tmp_path / "run")
    for length in (32, 64):  # two sweeps in one process (as sweep_runs makes for runs of other eval settings)
        [row] = sweep([str(run)], folder, "test", [length], tmp_path / "out", progress=False)
        assert row["data_verified"] == "size"
    assert capsys.readouterr().err.count("records no block checksums") == 1


def test_damaged_train_split_refuses_the_data_config_level_and_size_lets_it_through(
        data_dir: Path, tmp_path: Path) -> None:
    folder = _copy(data_dir, tmp_path / "data")
    with open(folder / "train.bin", "r+b") as f:
        f.seek(100_000)
        f.write(bytes(65536))
    with pytest.raises(DataError, match=r"train.bin fails its block check: block at offset 65536 "):
        open_data(_cfg(folder))
    assert open_data(_cfg(folder, "size"))[0].verified == "size"


def test_printed_commands_keep_the_folders_tokenizer(data_dir: Path, tmp_path: Path) -> None:
    folder = _copy(data_dir, tmp_path / "my data")  # a space: the commands quote it
    (folder / "manifest.json").unlink()  # a rebuild killed before the manifest was written
    with pytest.raises(DataError) as err:
        load_manifest(folder, vocab_size=2048)
    command = re.search(r"run `([^`]*)`", str(err.value)).group(1)
    assert shlex.split(command) == ["python", "data_prep/prepare.py", "--source", "python-stdlib", "--out",
                                    str(folder), "--tokenizer", str(folder / "tokenizer.model")]
    (folder / "tokenizer.model").unlink()  # nothing to keep: the model's vocabulary size
    with pytest.raises(DataError, match=re.escape(f"--out '{folder}' --vocab-size 2048`")):
        load_manifest(folder, vocab_size=2048)
    manifest = {"source": {"spec": "corpus dir/*.txt"}, "tokenizer": {"file": "tokenizer.model"},
                "options": {"text_field": "content", "max_bytes": 300000, "seed": 0, "val_fraction": 0.05,
                            "test_fraction": 0.1, "vocab_size": None}}
    assert reprepare_command("data/my set", manifest) == (
        "python data_prep/prepare.py --source 'corpus dir/*.txt' --out 'data/my set' --tokenizer "
        "'data/my set/tokenizer.model' --text-field content --max-bytes 300000 --seed 0 --val-fraction 0.05 "
        "--test-fraction 0.1 --force")


def _model(folder: Path, run: Path) -> Path:
    cfg = Config(model=ModelConfig(vocab_size=512, d_model=16, n_heads=2, n_layers=1, ffn_mult=2,
                                   architecture="transformer", position="alibi"),
                 data=DataConfig(path=str(folder), seq_len=32), train=TrainConfig())
    save_model_file(run / "model.pt", cfg, build_model(cfg.model), {"step": 0})
    return run


@pytest.mark.slow
def test_evaluation_refuses_a_damaged_test_split_and_the_printed_command_repairs_it(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from regulargpt.commands.extrapolate import main

    folder = _copy(data_dir, tmp_path / "my data")
    original = (folder / "test.bin").read_bytes()
    with open(folder / "test.bin", "r+b") as f:  # the reproduction of issue 37: 16 KB zeroed at offset 4096
        f.seek(4096)
        f.write(bytes(16384))
    damaged = (folder / "test.bin").read_bytes()
    torch.manual_seed(0)
    run = _model(folder, tmp_path / "run")
    argv = ["--runs", str(run), "--data", str(folder), "--lengths", "32", "--out", str(tmp_path / "out"),
            "--no-progress"]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert (f"test.bin fails its block check: block at offset 0 (65536 bytes): sha256 expected "
            f"{_sha(original)[:12]}… got {_sha(damaged)[:12]}…") in line  # one block covers the 61 KB file
    assert not (tmp_path / "out").exists()
    command = shlex.split(line.split("re-prepare the folder: ")[1])
    assert command[command.index("--tokenizer") + 1] == str(folder / "tokenizer.model")
    proc = subprocess.run([sys.executable, *command[1:], "--num-proc", "1"], cwd=ROOT, env=run_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (folder / "test.bin").read_bytes() == original
    assert main(argv) == 0


@pytest.mark.slow
def test_a_resumed_run_refuses_a_damaged_train_split(zero3_run: Path, data_dir: Path, tmp_path: Path) -> None:
    """The shared 12-step run, copied and extended to 15 steps on a damaged copy of its data (data.path may change
    on resume): refused before anything is trained. Before issue 37 it trained on the zeros."""
    folder, run = _copy(data_dir, tmp_path / "data"), tmp_path / "run"
    shutil.copytree(zero3_run, run)
    with open(folder / "train.bin", "r+b") as f:  # 64 KiB zeroed from 140,000: inside the tiled blocks at
        f.seek(140_000)                          # 131,072 and 196,608 of the 331 KB file
        f.write(bytes(65536))
    extend = pretrain_cmd(1) + pretrain_args(folder, run, *ZERO3) + ["--extend-to", "15"]
    proc = subprocess.run(extend, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert f"{folder}/train.bin fails its block check: block at offset 131072" in line and "--force" in line
    assert "(2 of 6 blocks differ)" in line and (run / "latest").read_text().strip() == "global_step12"
