"""Training on a weighted mixture of prepared folders (data.paths + data.weights; docs/MIXTURES.md).

The corpora here are hand-made folders whose token ids lie in disjoint ranges (corpus k: ids 100k .. 100k + 99),
so the corpus a window came from is read off its tokens, not asked of the sampler. Expected windows are computed
from the formula written out here with numpy, and shares are checked against a binomial bound."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, fake_data_folder, pretrain, pretrain_args, pretrain_cmd, read_metrics, run_env, snapshot

from regulargpt import run_directory as rd
from regulargpt.config import Config, ConfigError, DataConfig, ModelConfig, TrainConfig, load_config
from regulargpt.data import DataError, WindowSampler
from regulargpt.data.mixture import MixtureSampler, normalise_weights
from regulargpt.errors import TrainError
from regulargpt.train.lm_data import check_same_data, data_fingerprint, open_corpora, train_sampler

T, B, SEED = 8, 4, 7
TOKENIZER = b"shared fake tokenizer"
CONFIG = ROOT / "configs/tiny/regular_gpt.json"


def _tokens(k: int, n: int) -> np.ndarray:
    """Corpus k's tokens: random ids in 100k .. 100k + 99 (so every window names its corpus)."""
    return np.random.default_rng(k).integers(100 * k, 100 * k + 100, n)


def _splits(k: int, train: int) -> dict[str, np.ndarray]:
    return {"train": _tokens(k, train), "val": _tokens(k, 50), "test": _tokens(k, 80)}


@pytest.fixture
def folders(tmp_path: Path) -> list[Path]:
    """Three folders sharing a tokenizer, of 600, 900 and 300 train tokens, ids in disjoint ranges."""
    return [fake_data_folder(tmp_path / name, _splits(k, n),
                             vocab_size=300, tokenizer=TOKENIZER)
            for k, (name, n) in enumerate([("a", 600), ("b", 900), ("c", 300)])]


def _cfg(folders: list[Path], weights: list[float] = (), **data: object) -> Config:
    paths = [str(f) for f in folders]
    section = DataConfig(path=paths[0], seq_len=T, **data) if len(paths) == 1 else DataConfig(
        paths=paths, weights=[float(w) for w in weights], seq_len=T, **data)
    return Config(model=ModelConfig(vocab_size=300, d_model=8, n_heads=2), data=section,
                  train=TrainConfig(batch_size=B, seed=SEED))


def _corpus_of(row: np.ndarray) -> int:
    """The corpus a window came from, by its ids; asserts the whole window lies in that one corpus's range."""
    ks = set((np.asarray(row) // 100).tolist())
    assert len(ks) == 1, f"a window spans corpora {ks}"
    return ks.pop()


# ------------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("sets, key", [
    (["data.paths=a/x,b/y", "data.weights=3"], "data.weights"),  # wrong length
    (["data.paths=a/x,b/y", "data.weights=3,0"], r"data.weights\[1\]"),
    (["data.paths=a/x,b/y", "data.weights=-1,1"], r"data.weights\[0\]"),
    (["data.paths=a/x,b/y", "data.weights=3,nan"], r"data.weights\[1\]"),
    (["data.paths=a/x,b/y", "data.weights=inf,1"], r"data.weights\[0\]"),
    (["data.paths=a/x,a/x/"], r"data.paths\[1\]"),  # the same folder twice
    (["data.paths=a/x,b/x"], r"data.paths\[1\]"),  # two folders of one name
    (["data.paths=a/x"], "data.paths"),
    (["data.weights=1,2"], "data.weights"),  # weights without paths
])
def test_each_bad_mixture_value_is_an_error_naming_its_key(sets: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key}: .* (is not allowed|expected)"):
        load_config(CONFIG, ["data.path=", *sets])


def test_both_path_and_paths_set_is_an_error_that_says_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"data.paths: .*set one of data.path .* or data.paths .*--set data.path="):
        load_config(CONFIG, ["data.paths=a/x,b/y"])  # configs/base.json sets data.path


def test_mixture_keys_load_from_the_command_line_and_a_json_file(tmp_path: Path) -> None:
    cfg = load_config(CONFIG, ["data.path=", "data.paths=data/web,data/code", "data.weights=3,1"])
    assert (cfg.data.paths, cfg.data.weights, cfg.data.folders) == (["data/web", "data/code"], [3.0, 1.0],
                                                                     ["data/web", "data/code"])
    assert load_config(CONFIG, ["data.path=", 'data.paths=["a", "b"]', "data.weights=[1, 2]"]).data.weights == [1, 2]
    child = tmp_path / "mix.json"
    child.write_text(json.dumps({"extends": str(CONFIG), "data": {"path": "", "paths": ["d/web", "d/code"],
                                                                  "weights": [1, 1]}}))
    assert load_config(child).data.paths == ["d/web", "d/code"]
    assert load_config(CONFIG).data.folders == [load_config(CONFIG).data.path]  # one folder as before


def test_weights_are_normalised_given_or_by_train_tokens(folders: list[Path]) -> None:
    assert normalise_weights([3, 1], [5, 5]) == [0.75, 0.25]
    assert normalise_weights([], [100, 300]) == [0.25, 0.75]
    assert [c.weight for c in open_corpora(_cfg(folders, [2, 1, 1]))] == [0.5, 0.25, 0.25]
    assert [c.weight for c in open_corpora(_cfg(folders))] == [600 / 1800, 900 / 1800, 300 / 1800]


# ---------------------------------------------------------------------------------------------------- sampling


def _shares_test(sampler: MixtureSampler, weights: list[float], steps: int, ranks: int) -> None:
    counts, n = np.zeros(len(weights)), 0
    for rank in range(ranks):
        sampler.rank = rank
        for step in range(steps):
            for micro in range(2):
                for row in sampler.batch(step, micro).numpy():
                    counts[_corpus_of(row)] += 1
                    n += 1
    for k, w in enumerate(weights):  # 5 standard deviations of a binomial(n, w): false alarm ~ 6e-7 per corpus
        assert abs(counts[k] - n * w) <= 5 * math.sqrt(n * w * (1 - w)), (k, counts, n, weights)


def test_shares_of_sequences_follow_the_weights(folders: list[Path]) -> None:
    cfg = _cfg(folders, [6, 3, 1])
    sampler = train_sampler(open_corpora(cfg), cfg, rank=0, world=2)
    _shares_test(sampler, [0.6, 0.3, 0.1], steps=150, ranks=2)  # 2,400 sequences
    assert sampler.drawn.sum() == 150 * 2 * 2 * B


def test_empty_weights_mix_in_proportion_to_train_tokens(folders: list[Path]) -> None:
    cfg = _cfg(folders)
    _shares_test(train_sampler(open_corpora(cfg), cfg, 0, 1), [1 / 3, 1 / 2, 1 / 6], steps=150, ranks=1)


def test_each_window_is_the_written_out_formula_and_lies_in_one_corpus(folders: list[Path]) -> None:
    """Sequence i: u_i = default_rng([seed, step, micro, rank, 0]).random(B)[i], corpus k = 0 if u < 0.5, 1 if
    u < 0.75, else 2 (weights 2:1:1); start = default_rng([seed, step, micro, rank, k + 1]).integers(0, n_k - T,
    B)[i]."""
    cfg = _cfg(folders, [2, 1, 1])
    tokens = [np.fromfile(f / "train.bin", dtype=np.uint16) for f in folders]
    for rank in (0, 1):
        sampler = train_sampler(open_corpora(cfg), cfg, rank, 2)
        for step, micro in [(0, 0), (3, 1), (41, 0), (1000, 2)]:
            got = sampler.batch(step, micro).numpy()
            u = np.random.default_rng([SEED, step, micro, rank, 0]).random(B)
            for i in range(B):
                k = 0 if u[i] < 0.5 else 1 if u[i] < 0.75 else 2
                start = np.random.default_rng([SEED, step, micro, rank, k + 1]).integers(0, len(tokens[k]) - T, B)[i]
                assert _corpus_of(got[i]) == k
                np.testing.assert_array_equal(got[i], tokens[k][start:start + T + 1])


def test_single_folder_windows_are_unchanged(folders: list[Path]) -> None:
    """data.path keeps today's windows: starts = default_rng([seed, step, micro, rank]).integers(0, n - T, B)."""
    cfg = _cfg(folders[:1])
    tokens = np.fromfile(folders[0] / "train.bin", dtype=np.uint16)
    sampler = train_sampler(open_corpora(cfg), cfg, rank=1, world=2)
    for step, micro in [(0, 0), (5, 1), (999, 3)]:
        starts = np.random.default_rng([SEED, step, micro, 1]).integers(0, 600 - T, B)
        np.testing.assert_array_equal(sampler.batch(step, micro).numpy(),
                                      np.stack([tokens[s:s + T + 1] for s in starts]))
    # pinned: the starts the sampler before mixtures drew (regulargpt/data/sampler.py at c9c8496)
    assert isinstance(sampler, WindowSampler) and sampler.starts(5, 1).tolist() == [143, 282, 88, 144]


def test_a_resumed_sampler_draws_the_same_and_continues_the_counts(folders: list[Path]) -> None:
    cfg = _cfg(folders, [1, 1, 2])
    whole = train_sampler(open_corpora(cfg), cfg, 0, 1)
    first = train_sampler(open_corpora(cfg), cfg, 0, 1)
    expected = [whole.batch(step).numpy() for step in range(20)]
    for step in range(10):
        first.batch(step)
    first.record_totals(first.drawn)  # what a checkpoint at step 10 keeps (one rank: its own counts)
    saved = json.loads(json.dumps(first.settings()))
    resumed = train_sampler(open_corpora(cfg), cfg, 0, 1)
    resumed.check_resume(saved)
    for step in range(10, 20):
        np.testing.assert_array_equal(resumed.batch(step).numpy(), expected[step])
    assert resumed.record_totals(resumed.drawn) == whole.record_totals(whole.drawn)
    assert sum(whole.totals) == 20 * B
    other = train_sampler(open_corpora(_cfg(folders, [1, 1, 1])), cfg, 0, 1)
    with pytest.raises(DataError, match="weights="):
        other.check_resume(saved)


# ------------------------------------------------------------------------------------------------------ opening


def _one_line_error(cfg: Config) -> str:
    with pytest.raises((DataError, TrainError)) as err:
        open_corpora(cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_damaged_second_folder_is_refused_naming_it(folders: list[Path]) -> None:
    with open(folders[1] / "train.bin", "r+b") as handle:
        handle.truncate(1000)  # 500 of its 900 tokens
    assert str(folders[1] / "train.bin") in _one_line_error(_cfg(folders))


def test_a_folder_with_another_tokenizer_or_vocabulary_is_refused_naming_both(folders: list[Path],
                                                                              tmp_path: Path) -> None:
    other = fake_data_folder(tmp_path / "other", _splits(1, 100), vocab_size=300,
                             tokenizer=b"another tokenizer")
    message = _one_line_error(_cfg([folders[0], other]))
    assert str(other) in message and str(folders[0]) in message and "--tokenizer" in message
    small = fake_data_folder(tmp_path / "small", _splits(0, 100), vocab_size=200,
                             tokenizer=TOKENIZER)
    assert str(small) in _one_line_error(_cfg([folders[0], small]))
    short = fake_data_folder(tmp_path / "short", _splits(0, T), vocab_size=300,
                             tokenizer=TOKENIZER)
    assert "fewer than data.seq_len + 1" in _one_line_error(_cfg([folders[0], short]))


# ------------------------------------------------------------------------------------------------------- resume


def test_a_resume_with_changed_weights_or_content_is_refused_and_moved_folders_are_not(folders: list[Path],
                                                                                       tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = _cfg(folders, [3, 2, 1])
    rd.check_or_write_config(run_dir, cfg)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')  # it trained
    with pytest.raises(TrainError, match=r"data.weights: run has \[3.0, 2.0, 1.0\], now \[1.0, 1.0, 1.0\]"):
        rd.check_or_write_config(run_dir, _cfg(folders, [1, 1, 1]), write=False)
    moved = [tmp_path / "moved" / f.name for f in folders]
    rd.check_or_write_config(run_dir, _cfg(moved, [3, 2, 1]), write=False)  # paths may move: content is compared
    saved = data_fingerprint(open_corpora(cfg))
    assert check_same_data(run_dir, saved, data_fingerprint(open_corpora(cfg))) is None
    fake_data_folder(tmp_path / "c2", _splits(2, 400), 300, tokenizer=TOKENIZER)
    changed = data_fingerprint(open_corpora(_cfg([*folders[:2], tmp_path / "c2"], [3, 2, 1])))
    with pytest.raises(TrainError, match=r"corpora\[2\].train.tokens: checkpoint 300, now 400"):
        check_same_data(run_dir, saved, changed)


def test_a_single_folder_keeps_the_fingerprint_its_checkpoints_hold(folders: list[Path]) -> None:
    """Checkpoints written before mixtures existed hold these four keys; a single-folder run must still match."""
    assert data_fingerprint(open_corpora(_cfg(folders[:1]))) == {
        "tokenizer_sha256": hashlib.sha256(TOKENIZER).hexdigest(), "vocab_size": 300, "train_tokens": 600,
        "val_tokens": 50}


def test_a_resume_takes_the_runs_mixture_unless_the_command_names_one(folders: list[Path], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rd.check_or_write_config(run_dir, _cfg(folders, [3, 2, 1]))
    plain = _cfg(folders[:1])
    cfg, note = rd.with_saved_data_path(run_dir, plain, [])
    assert (cfg.data.path, cfg.data.paths, cfg.data.weights) == ("", [str(f) for f in folders], [3, 2, 1])
    assert "data.paths=" in note
    assert rd.with_saved_data_path(run_dir, plain, [f"data.path={folders[0]}"]) == (plain, None)


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_a_tiny_run_on_two_corpora_logs_their_counts_and_losses_and_is_scored_per_corpus(data_dir: Path,
                                                                                        tmp_path: Path) -> None:
    """configs/tiny on stdlib (the prepared fixture) + a folder of its token streams reversed (same tokenizer),
    weights 3:1; a restart on a changed second folder is refused and leaves the run's record alone; then
    eval/extrapolate.py without --data writes rows for each corpus."""
    manifest = json.loads((data_dir / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"])
    splits = {name: np.fromfile(data_dir / info["file"], dtype=dtype)[::-1] for name, info in
              manifest["splits"].items()}
    other = fake_data_folder(tmp_path / "reversed", splits, vocab_size=manifest["vocab_size"], dtype=manifest["dtype"],
                             tokenizer=(data_dir / manifest["tokenizer"]["file"]).read_bytes())
    run_dir = tmp_path / "run"
    sets = ["data.path=", f"data.paths={data_dir},{other}", "data.weights=3,1", "train.steps=6", "train.eval_every=3",
            "train.log_every=2", "train.save_every=0"]
    pretrain(data_dir, run_dir, *sets)
    rows = read_metrics(run_dir)
    names = [data_dir.name, "reversed"]
    for row in rows:
        assert sum(row[f"sequences/{n}"] for n in names) == row["step"] * 4  # train.batch_size=4, 1 process
    validated = [row for row in rows if "val_loss" in row]
    assert [row["step"] for row in validated] == [3, 6]
    for row in validated:
        assert row["val_loss"] == pytest.approx(0.75 * row[f"val_loss/{names[0]}"] + 0.25 * row["val_loss/reversed"])
    record = json.loads((run_dir / "mixture.json").read_text())
    train_tokens = manifest["splits"]["train"]["tokens"]
    assert [(c["name"], c["weight"], c["train_tokens"]) for c in record] == [(names[0], 0.75, train_tokens),
                                                                             ("reversed", 0.25, train_tokens)]
    state = json.loads((run_dir / "global_step6" / "trainer_state.json").read_text())
    assert state["sampler"]["drawn"] == [rows[-1][f"sequences/{n}"] for n in names]
    assert [c["weight"] for c in state["data"]["corpora"]] == [0.75, 0.25]

    # the same command on a folder of other content: refused before the run's record is rewritten
    changed = fake_data_folder(tmp_path / "changed" / "reversed", {k: v[1:] for k, v in splits.items()},
                               vocab_size=manifest["vocab_size"], dtype=manifest["dtype"],
                               tokenizer=(data_dir / manifest["tokenizer"]["file"]).read_bytes())
    record = snapshot(run_dir / "config.resolved.json", run_dir / "mixture.json")
    args = pretrain_args(data_dir, run_dir, *sets[:1], f"data.paths={data_dir},{changed}", *sets[2:])
    proc = subprocess.run(pretrain_cmd(1) + args, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "corpora[1].train.tokens: checkpoint" in proc.stderr, proc.stderr[-2000:]
    assert snapshot(run_dir / "config.resolved.json", run_dir / "mixture.json") == record

    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, str(ROOT / "eval/extrapolate.py"), "--runs", str(run_dir), "--out",
                           str(out), "--lengths", "32,64", "--tokens", "256", "--no-progress"], cwd=ROOT,
                          env=run_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scored = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["dataset"], r["length"]) for r in scored) == sorted(
        (n, length) for n in names for length in (32, 64))
    assert all(r["ppl"] > 1 for r in scored)
    table = (out / "table.md").read_text()
    assert f"## {names[0]} · test split" in table and "## reversed · test split" in table
