"""Perplexity sweeps (eval/extrapolate.py, regulargpt.evaluation.perplexity): token accounting of both protocols,
uniform logits → ppl = vocab size, nonoverlapping = sliding at stride L, 2 processes = 1 process, resume, skipped
rows, clear errors, report files. Tiny data written directly (manifest + .bin), tiny untrained models."""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from regulargpt.checkpoint import save_model_file
from regulargpt.config import Config, DataConfig, ModelConfig, TrainConfig
from regulargpt.evaluation.lm_report import aggregate, load_rows, write_report
from regulargpt.evaluation.length_sweep import ResultsFile, sweep
from regulargpt.evaluation.perplexity import EvalError, plan_tokens, plan_windows, position_buckets
from regulargpt.files import TornLineWarning
from regulargpt.model import build_model
from helpers import HAS_MATPLOTLIB, free_port, load_script

ROOT = Path(__file__).resolve().parents[1]
VOCAB, TRAIN_LEN, STREAM = 61, 16, 1100


def _write_data(folder: Path, tokens: np.ndarray, tokenizer: bytes = b"fake sentencepiece model") -> Path:
    folder.mkdir(parents=True)
    (folder / "tokenizer.model").write_bytes(tokenizer)
    splits = {}
    for name, part in (("train", tokens[:100]), ("val", tokens[:50]), ("test", tokens)):
        part.astype(np.uint16).tofile(folder / f"{name}.bin")
        splits[name] = {"tokens": len(part), "documents": 1, "file": f"{name}.bin"}
    manifest = {"format_version": 1, "dtype": "uint16", "vocab_size": VOCAB, "splits": splits,
                "tokenizer": {"file": "tokenizer.model", "sha256": hashlib.sha256(tokenizer).hexdigest()}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    return _write_data(tmp_path_factory.mktemp("data") / "tinyset", rng.integers(0, VOCAB, STREAM))


def _run(folder: Path, data: Path, seed: int = 0, uniform: bool = False, meta: dict | None = None,
         **model: object) -> str:
    fields: dict[str, object] = {"vocab_size": VOCAB, "d_model": 16, "n_heads": 2, "n_layers": 2, "ffn_mult": 2,
                                 "chunk_size": 2, "thickness": 1, "architecture": "transformer", "position": "alibi"}
    fields.update(model)
    cfg = Config(model=ModelConfig(**fields), data=DataConfig(path=str(data), seq_len=TRAIN_LEN),
                 train=TrainConfig(seed=seed))
    torch.manual_seed(seed)
    net = build_model(cfg.model)
    if uniform:
        torch.nn.init.zeros_(net.head.proj.weight)  # every logit 0 → uniform next-token distribution
    save_model_file(folder / "model.pt", cfg, net, meta or {"step": 0})
    return str(folder)


# ------------------------------------------------------------------------------------------------ accounting


@pytest.mark.parametrize("n,length,stride", [(10, 4, 2), (64, 16, 16), (100, 16, 5), (97, 32, 1), (33, 33, 7)])
def test_sliding_scores_every_target_once_with_context(n: int, length: int, stride: int) -> None:
    plan = plan_windows(n, length, "sliding", stride)
    hits = np.zeros(n + 1, dtype=int)
    for w, (start, first) in enumerate(zip(plan.starts, plan.score_from)):
        assert 0 <= start and start + length <= n  # inputs start..start+L-1, targets up to start+L <= n
        hits[start + 1 + first: start + length + 1] += 1
        if w:
            assert first >= length - stride  # at least L - S inputs before every scored target after window 0
    assert hits[0] == 0 and (hits[1:] == 1).all() and plan.tokens == n


def test_nonoverlapping_windows_and_equal_counts_across_lengths() -> None:
    counts = plan_tokens(5000, [16, 32, 64, 128])
    assert counts == {16: 4992, 32: 4992, 64: 4992, 128: 4992}  # 39 windows of 128, rounded to the lcm
    plan = plan_windows(counts[32], 32, "nonoverlapping")
    assert plan.starts.tolist() == list(range(0, 4992, 32)) and (plan.score_from == 0).all() and plan.tokens == 4992
    assert plan_tokens(5000, [16, 6000]) == {16: 4992, 6000: 0}  # the long length does not fit: 0 → skipped
    assert plan_tokens(5000, [16, 128], requested=1000) == {16: 896, 128: 896}
    assert plan_tokens(5000, [100, 128]) == {100: 3200, 128: 3200}  # lcm 3200
    assert plan_tokens(5000, [100, 129]) == {100: 4900, 129: 4902}  # lcm too big: N = 38·129, ⌊N/L⌋·L each
    assert plan_tokens(5000, [100, 129], protocol="sliding") == {100: 4902, 129: 4902}
    with pytest.raises(EvalError, match="at least 128"):
        plan_tokens(5000, [16, 128], requested=100)


def test_position_buckets_are_octaves() -> None:
    sums, counts = np.arange(10, dtype=float), np.ones(10, dtype=int)
    buckets = position_buckets(sums, counts)
    assert [(b["start"], b["end"], b["tokens"]) for b in buckets] == [(0, 1, 1), (1, 2, 1), (2, 4, 2), (4, 8, 4), (8, 10, 2)]
    assert buckets[3]["nll"] == pytest.approx(5.5)


# ------------------------------------------------------------------------------------------------ scoring


def test_uniform_logits_give_ppl_equal_to_vocab_size_in_both_protocols(data: Path, tmp_path: Path) -> None:
    run = _run(tmp_path / "uniform", data, uniform=True)
    rows = sweep([run], data, "test", [16, 64, 256], tmp_path / "out", progress=False)
    rows += sweep([run], data, "test", [16, 64, 256], tmp_path / "out", protocol="sliding", progress=False)
    assert len(rows) == 6
    for row in rows:
        assert math.isclose(row["ppl"], VOCAB, rel_tol=1e-6)
        assert row["tokens"] == 1024  # 4 windows of 256; the same targets at every length and protocol
        assert all(math.isclose(b["nll"], math.log(VOCAB), rel_tol=1e-6) for b in row["per_position"])
        assert sum(b["tokens"] for b in row["per_position"]) == row["tokens"]


def test_nonoverlapping_equals_sliding_with_stride_l_at_training_length(data: Path, tmp_path: Path) -> None:
    runs = [_run(tmp_path / "alibi", data), _run(tmp_path / "regular", data, architecture="regular_gpt",
                                                   position="none")]
    for run in runs:
        a = sweep([run], data, "test", [TRAIN_LEN], tmp_path / "a", progress=False)[0]
        b = sweep([run], data, "test", [TRAIN_LEN], tmp_path / "b", protocol="sliding", stride=TRAIN_LEN,
                  progress=False)[0]
        assert (a["tokens"], a["windows"], a["stride"]) == (b["tokens"], b["windows"], b["stride"])
        assert a["nll"] == b["nll"] and a["per_position"] == b["per_position"]
        half = sweep([run], data, "test", [TRAIN_LEN], tmp_path / "c", protocol="sliding", progress=False)[0]
        assert half["stride"] == TRAIN_LEN // 2 and half["tokens"] == a["tokens"] and half["nll"] != a["nll"]


def test_resume_skips_done_rows_and_repairs_a_torn_line(data: Path, tmp_path: Path) -> None:
    run, out = _run(tmp_path / "r", data), tmp_path / "out"
    assert len(sweep([run], data, "test", [16, 32], out, progress=False)) == 2
    with open(out / "results.jsonl", "ab") as f:
        f.write(b'{"run": "torn by a cra')  # a crash in the middle of an append
    with pytest.warns(TornLineWarning, match="torn last line.*cut it off"):
        rows = sweep([run], data, "test", [16, 32, 64], out, progress=False)
    assert [r["length"] for r in rows] == [64]
    assert [r["length"] for r in ResultsFile(out / "results.jsonl").rows] == [16, 32, 64]
    assert sweep([run], data, "test", [16, 32, 64], out, progress=False) == []


def test_lengths_that_cannot_run_get_skipped_rows(data: Path, tmp_path: Path) -> None:
    run = _run(tmp_path / "r", data)
    rows = sweep([run], data, "test", [16, 512], tmp_path / "out", memory_gb=5e-4, progress=False)
    assert rows[0]["ppl"] is not None
    assert rows[1]["ppl"] is None and rows[1]["skipped"].startswith("needs ~") and "GiB" in rows[1]["skipped"]
    rows = sweep([run], data, "test", [16, 512], tmp_path / "out", memory_gb=4.0, progress=False)  # bigger budget: retried
    assert [r["length"] for r in rows] == [512] and rows[0]["ppl"] is not None
    learned = _run(tmp_path / "learned", data, position="learned", max_positions=32)
    rows = sweep([learned], data, "test", [32, 64, 4096], tmp_path / "out2", progress=False)
    assert rows[0]["ppl"] is not None
    assert "max_positions=32" in rows[1]["skipped"] and "fewer than one window" in rows[2]["skipped"]


def test_clear_errors(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "r", data)
    with pytest.raises(EvalError, match="does not exist"):
        sweep([run], tmp_path / "no-such-data", "test", [16], tmp_path / "out", progress=False)
    with pytest.raises(EvalError, match="no model.pt"):
        sweep([str(tmp_path)], data, "test", [16], tmp_path / "out", progress=False)
    other = _write_data(tmp_path / "other", np.arange(200) % VOCAB, tokenizer=b"another tokenizer")
    with pytest.raises(EvalError, match=rf"tokenizer sha256.*prepare.py --tokenizer {data}/tokenizer.model …"):
        sweep([run], other, "test", [16], tmp_path / "out", progress=False)  # the file the run's data folder holds
    stamped = _run(tmp_path / "stamped", data, meta={"tokenizer_sha256": "0" * 64})
    with pytest.raises(EvalError, match="tokenizer sha256 000000000000"):
        sweep([stamped], data, "test", [16], tmp_path / "out", progress=False)
    # a model.pt exported before the hash was stored in its meta: the checkpoint's data fingerprint is still read
    old = _run(tmp_path / "old", data, meta={"step": 3, "checkpoint": "global_step3"})
    (tmp_path / "old" / "global_step3").mkdir()
    (tmp_path / "old" / "global_step3" / "trainer_state.json").write_text(
        json.dumps({"step": 3, "data": {"tokenizer_sha256": "1" * 64, "vocab_size": VOCAB}}))
    with pytest.raises(EvalError, match=r"tokenizer sha256 111111111111… \(.*trainer_state.json\)"):
        sweep([old], data, "test", [16], tmp_path / "out", progress=False)
    wide = _run(tmp_path / "wide", data, vocab_size=VOCAB + 3)
    with pytest.raises(EvalError, match="vocab_size 64 does not match"):
        sweep([wide], data, "test", [16], tmp_path / "out", progress=False)
    with pytest.raises(EvalError, match="lengths"):
        sweep([run], data, "test", [0, 16], tmp_path / "out", progress=False)
    with pytest.raises(SystemExit) as exit_info:
        load_script("eval/extrapolate.py").main(["--runs", run, "--data", str(data), "--out", str(tmp_path / "o"), "--lengths", "0,16"])
    assert exit_info.value.code == 2 and "argument --lengths: '0,16': expected comma-separated integers >= 1" in capsys.readouterr().err
    assert load_script("eval/extrapolate.py").main(["--runs", run, "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- CLI and 2 processes


@pytest.mark.slow
def test_two_processes_equal_one_and_the_report(data: Path, tmp_path: Path) -> None:
    runs = [_run(tmp_path / "a0", data, seed=0), _run(tmp_path / "a1", data, seed=1),
            _run(tmp_path / "g0", data, architecture="regular_gpt", position="none")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels as the single-threaded subprocesses
    try:
        one = sweep(runs, data, "test", [16, 64, 256], tmp_path / "one", protocol="sliding", batch_size=1,
                    progress=False)
    finally:
        torch.set_num_threads(threads)
    write_report(load_rows(tmp_path / "one" / "results.jsonl"), tmp_path / "one", command="pytest")
    port = str(free_port())
    args = [sys.executable, "eval/extrapolate.py", "--runs", *runs, "--data", str(data), "--lengths", "16,64,256",
            "--protocol", "sliding", "--batch-size", "1", "--no-progress", "--device", "cpu", "--out",
            str(tmp_path / "two")]
    procs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "LOCAL_RANK": str(r),
                                   "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
             for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    two = load_rows(tmp_path / "two" / "results.jsonl")
    assert len(one) == len(two) == 9 and all(r["world_size"] == 2 for r in two)
    for a, b in zip(one, two):
        assert (a["run"], a["length"], a["tokens"], a["windows"]) == (b["run"], b["length"], b["tokens"], b["windows"])
        assert math.isclose(a["nll"], b["nll"], rel_tol=1e-12)
        assert [x["tokens"] for x in a["per_position"]] == [x["tokens"] for x in b["per_position"]]
    for out in ("one", "two"):  # the library call and rank 0 of the CLI both write the report
        table = (tmp_path / out / "table.md").read_text()
        assert "Git commit" in table and "Every length scores the same 1,024 tokens." in table
        assert "| ALiBi |" in table and "| RegularGPT C2 K1 |" in table and "16 (1×)" in table
        for name in ("ppl_vs_length.png", "loss_vs_position.png"):  # plots are optional (no matplotlib: none)
            assert (tmp_path / out / name).read_bytes()[:4] == b"\x89PNG" or not HAS_MATPLOTLIB


# ------------------------------------------------------------------------------------------ variants and eval section


def _run_cfg(folder: Path, data: Path, seed: int = 0, steps: int = 1000, meta_step: int | None = None,
             eval_section: dict | None = None, **model: object) -> str:
    """A saved untrained run whose config differs from the default by `model`, `steps` and `eval_section`."""
    from regulargpt.config import EvalConfig

    fields: dict[str, object] = {"vocab_size": VOCAB, "d_model": 16, "n_heads": 2, "n_layers": 2, "ffn_mult": 2,
                                 "chunk_size": 2, "thickness": 1, "architecture": "regular_gpt"}
    fields.update(model)
    cfg = Config(model=ModelConfig(**fields, train_length=TRAIN_LEN), data=DataConfig(path=str(data), seq_len=TRAIN_LEN),
                 train=TrainConfig(seed=seed, steps=steps), eval=EvalConfig(**(eval_section or {})))
    torch.manual_seed(seed)
    save_model_file(folder / "model.pt", cfg, build_model(cfg.model), {"step": steps if meta_step is None else meta_step})
    return str(folder)


def test_runs_sharing_a_label_are_separate_rows_keyed_by_variant(data: Path, tmp_path: Path) -> None:
    """Three different checkpoints with one model label (a 200-step run, its 160-step checkpoint, a 120-step run)
    and a second seed of the first: three table rows, seeds counted per variant, labels say what differs."""
    from regulargpt.evaluation.lm_report import aggregate

    runs = [_run_cfg(tmp_path / "a-s0", data, seed=0, steps=200),
            _run_cfg(tmp_path / "a-s1", data, seed=1, steps=200),
            _run_cfg(tmp_path / "a-s0-ckpt160", data, seed=0, steps=200, meta_step=160),
            _run_cfg(tmp_path / "b-s0", data, seed=0, steps=120)]
    out = tmp_path / "out"
    sweep(runs, data, "test", [16, 32], out, progress=False)
    sweep(runs[:1], data, "test", [16, 32], out, progress=False, depth_policy="train")
    (group,) = aggregate(load_rows(out / "results.jsonl")).values()
    labels = group["models"]
    assert sorted(labels) == sorted([
        "RegularGPT C2 K1 depth=adaptive steps=200",             # both seeds of the 200-step run
        "RegularGPT C2 K1 depth=adaptive steps=200 step=160",    # its step-160 checkpoint
        "RegularGPT C2 K1 depth=adaptive steps=120",
        "RegularGPT C2 K1 depth=train steps=200",                # the first run scored with depth_policy=train
    ]), labels
    final = "RegularGPT C2 K1 depth=adaptive steps=200"
    assert len(group["seeds"][final]) == 2 and len(group["cells"][(final, 16)]) == 2
    assert all(len(group["seeds"][m]) == 1 for m in labels if m != final)


def test_console_lines_name_the_run_directory(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _run_cfg(tmp_path / "my-run-dir", data)
    sweep([run], data, "test", [16], tmp_path / "out", progress=True)
    captured = capsys.readouterr()
    assert "my-run-dir" in captured.out + captured.err



def test_the_command_ends_with_the_table_and_a_rerun_says_what_it_skipped(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The console's last lines are table.md's table; a rerun scores nothing and says how many rows it kept."""
    run = _run(tmp_path / "r", data, uniform=True)
    argv = ["--runs", run, "--data", str(data), "--out", str(tmp_path / "out"), "--lengths", "16,32", "--no-progress"]
    assert load_script("eval/extrapolate.py").main(argv) == 0
    out = capsys.readouterr().out
    table = (tmp_path / "out" / "table.md").read_text()
    last = [line for line in table.splitlines() if line.startswith("| ALiBi")]
    assert last == ["| ALiBi | 0.006M | 1 | 61.00 | 61.00 |"] and last[0] in out.splitlines()  # uniform: ppl = V
    assert out.rstrip().splitlines()[-1] == table.rstrip().splitlines()[-1]  # the table's last line ends the output
    assert load_script("eval/extrapolate.py").main(argv) == 0
    captured = capsys.readouterr()
    assert "2 of 2 (run, length) rows were already in" in captured.err and last[0] in captured.out.splitlines()


@pytest.mark.parametrize("field,section,flag,check", [
    ("lengths", {"lengths": [16, 48]}, {"lengths": [32]},
     lambda rows, flag: sorted(r["length"] for r in rows) == ([32] if flag else [16, 48])),
    ("protocol", {"protocol": "sliding", "lengths": [16]}, {"protocol": "nonoverlapping"},
     lambda rows, flag: {r["protocol"] for r in rows} == {"nonoverlapping" if flag else "sliding"}),
    ("stride", {"protocol": "sliding", "stride": 4, "lengths": [16]}, {"stride": 8},
     lambda rows, flag: {r["stride"] for r in rows} == {8 if flag else 4}),
    ("tokens", {"tokens": 320, "lengths": [16]}, {"tokens": 160},
     lambda rows, flag: {r["tokens"] for r in rows} == {160 if flag else 320}),
    ("memory_gb", {"memory_gb": 0.5, "lengths": [16]}, {"memory_gb": 2.0},
     lambda rows, flag: {r["memory_gb"] for r in rows} == {2.0 if flag else 0.5}),
])
def test_the_runs_eval_section_drives_evaluation_and_flags_override_it(
        data: Path, tmp_path: Path, field: str, section: dict, flag: dict, check: object) -> None:
    from regulargpt.evaluation.length_sweep import sweep_runs

    run = _run_cfg(tmp_path / "run", data, eval_section=section)
    rows = sweep_runs([run], data, "test", tmp_path / "own", {}, progress=False)
    assert rows and check(rows, False), (field, rows[0])
    rows = sweep_runs([run], data, "test", tmp_path / "flag", flag, progress=False)
    assert rows and check(rows, True), (field, rows[0])


def test_bad_eval_values_are_one_line_errors(data: Path, tmp_path: Path) -> None:
    from regulargpt.evaluation.length_sweep import sweep_runs

    run = _run_cfg(tmp_path / "run", data)
    with pytest.raises(EvalError, match="lengths"):
        sweep_runs([run], data, "test", tmp_path / "out", {"lengths": [0]}, progress=False)


# ------------------------------------------------------------------------------------------- which weights


def _checkpoint_at(run: Path, step: int) -> None:
    """What `latest_step` reads of a training run: a global_step<N>/ folder named by `latest`."""
    (run / f"global_step{step}").mkdir()
    (run / "latest").write_text(f"global_step{step}")


def test_a_model_pt_older_than_the_runs_newest_checkpoint_is_refused_and_a_named_file_is_noted(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exported at step 65, resumed to a checkpoint at step 96: the run directory is refused (naming both steps
    and the export command); the file named explicitly is scored with a note, and its rows say step 65."""
    from regulargpt.evaluation.run_weights import StaleModelError

    run = Path(_run(tmp_path / "r", data, meta={"step": 65}))
    _checkpoint_at(run, 96)
    with pytest.raises(StaleModelError, match=r"step 65.*newest checkpoint is step 96.*launch/export\.py"):
        sweep([str(run)], data, "test", [TRAIN_LEN], tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "results.jsonl").exists()
    rows = sweep([str(run / "model.pt")], data, "test", [TRAIN_LEN], tmp_path / "out", progress=False)
    assert "holds the weights of step 65; the run's newest checkpoint is step 96" in capsys.readouterr().err
    assert [r["step"] for r in rows] == [65]


def test_rows_record_the_weights_hash_and_rows_of_other_weights_are_rescored(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hash is the same for the same weights saved twice, differs when one weight changes, and a rerun into the
    same folder after a re-export rescores the run instead of keeping the old weights' rows."""
    from regulargpt.evaluation.run_weights import weights_sha256

    run = Path(_run(tmp_path / "r", data, meta={"step": 10}))
    first = sweep([str(run)], data, "test", [TRAIN_LEN, 2 * TRAIN_LEN], tmp_path / "out", progress=False)
    state = torch.load(run / "model.pt", weights_only=True)["state_dict"]
    assert {r["weights_sha256"] for r in first} == {weights_sha256(state)} and {r["step"] for r in first} == {10}
    assert f"(ALiBi seed 0, step 10, weights {weights_sha256(state)[:12]})" in capsys.readouterr().out  # each line
    assert sweep([str(run)], data, "test", [TRAIN_LEN, 2 * TRAIN_LEN], tmp_path / "out", progress=False) == []
    assert "2 of 2 (run, length) rows were already in" in capsys.readouterr().err
    copy = Path(_run(tmp_path / "copy", data, meta={"step": 10}))  # same seed → same weights, another file
    assert weights_sha256(torch.load(copy / "model.pt", weights_only=True)["state_dict"]) == weights_sha256(state)
    changed = dict(state, **{"head.proj.weight": state["head.proj.weight"] + 1e-3})
    assert weights_sha256(changed) != weights_sha256(state)
    _run(tmp_path / "r", data, seed=1, meta={"step": 20})  # the run exported again, at a later step
    second = sweep([str(run)], data, "test", [TRAIN_LEN, 2 * TRAIN_LEN], tmp_path / "out", progress=False)
    assert [r["step"] for r in second] == [20, 20] and second[0]["weights_sha256"] != first[0]["weights_sha256"]
    assert [r["step"] for r in load_rows(tmp_path / "out" / "results.jsonl")] == [10, 10, 20, 20]


def test_depth_policy_applies_to_regular_gpt_runs_and_leaves_the_others_alone(data: Path, tmp_path: Path) -> None:
    alibi = _run(tmp_path / "alibi", data)
    rgpt = _run(tmp_path / "rgpt", data, architecture="regular_gpt", position="none")
    rows = sweep([alibi, rgpt], data, "test", [TRAIN_LEN], tmp_path / "out", progress=False, depth_policy="train")
    assert [(r["run"], r["depth_policy"]) for r in rows] == [(alibi, None), (rgpt, "train")]


# ------------------------------------------------------------------------- rows keyed by the data's content


def _rebuild(folder: Path, tokens: np.ndarray) -> str:
    """The folder prepared again with other content: new files, a manifest with their sha256 → test.bin's."""
    shutil.rmtree(folder, ignore_errors=True)
    _write_data(folder, tokens)
    manifest = json.loads((folder / "manifest.json").read_text())
    for info in manifest["splits"].values():
        info["sha256"] = hashlib.sha256((folder / info["file"]).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest["splits"]["test"]["sha256"]


def test_rows_of_a_rebuilt_folder_are_rescored_and_the_tables_read_only_the_new_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37 §2: the same --out after the folder was rebuilt with other content gives the numbers of a fresh
    --out, whether the token count (and so the row key) stayed the same or not."""
    rng, data, out = np.random.default_rng(1), tmp_path / "tinyset", tmp_path / "out"
    old_sha = _rebuild(data, rng.integers(0, VOCAB, STREAM))
    run = _run(tmp_path / "r", data)
    first = sweep([run], data, "test", [16, 32], out, progress=False)
    assert {json.dumps(r["split_fingerprint"]) for r in first} == {json.dumps({"sha256": old_sha, "tokens": STREAM})}
    new_sha = _rebuild(data, rng.integers(0, VOCAB, STREAM))  # same token count: the same row keys
    second = sweep([run], data, "test", [16, 32], out, progress=False)
    fresh = sweep([run], data, "test", [16, 32], tmp_path / "fresh", progress=False)
    assert [r["ppl"] for r in second] == [r["ppl"] for r in fresh] != [r["ppl"] for r in first]
    assert (f"rescored 2 (run, length) row(s) of {out}/results.jsonl: they scored other content (split sha256 "
            f"{old_sha[:12]}…, 1,100 tokens; now {new_sha[:12]}…, 1,100 tokens)") in capsys.readouterr().err
    _rebuild(data, rng.integers(0, VOCAB, 900))  # another token count: other row keys
    third = sweep([run], data, "test", [16, 32], out, progress=False)
    assert "1,100 tokens; now" in capsys.readouterr().err and len(load_rows(out / "results.jsonl")) == 6
    cells = aggregate(load_rows(out / "results.jsonl"))[("tinyset", "test", "nonoverlapping")]["cells"]
    assert sorted((length, ppl) for (_, length), ppl in cells.items()) == [(r["length"], [r["ppl"]]) for r in third]


def test_rows_that_record_no_data_identity_are_rescored(data: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run, out = _run(tmp_path / "r", data), tmp_path / "out"
    [row] = sweep([run], data, "test", [16], out, progress=False)
    del row["split_fingerprint"]  # a row written before rows recorded the data they scored
    (out / "results.jsonl").write_text(json.dumps(row) + "\n")
    assert len(sweep([run], data, "test", [16], out, progress=False)) == 1
    err = capsys.readouterr().err
    assert f"rescored 1 (run, length) row(s) of {out}/results.jsonl: they record no split fingerprint" in err


@pytest.mark.slow
def test_a_folder_prepared_again_with_another_seed_is_rescored_into_the_same_out(data_dir: Path,
                                                                                 tmp_path: Path) -> None:
    from regulargpt.data import prepare

    folder, out = tmp_path / "stdlib", tmp_path / "out"
    shutil.copytree(data_dir, folder)
    run = _run(tmp_path / "r", folder, vocab_size=512)
    first = sweep([run], folder, "test", [TRAIN_LEN], out, progress=False)
    prepare("python-stdlib", folder, tokenizer=folder / "tokenizer.model", max_bytes=400_000, val_fraction=0.2,
            seed=1, num_proc=1, log=lambda line: None)  # the fixture's options, another document split
    second = sweep([run], folder, "test", [TRAIN_LEN], out, progress=False)
    fresh = sweep([run], folder, "test", [TRAIN_LEN], tmp_path / "fresh", progress=False)
    assert [r["ppl"] for r in second] == [r["ppl"] for r in fresh] != [r["ppl"] for r in first]
    [group] = aggregate(load_rows(out / "results.jsonl")).values()
    assert list(group["cells"].values()) == [[second[0]["ppl"]]]  # the table: the new number only


# ------------------------------------------------------------------------------------------ without matplotlib

# Run first in a child process: every import of matplotlib fails, as on the GPU machine's image (issue 39 §2).
HIDE_MATPLOTLIB = """
import importlib.abc, sys
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Hide())
"""


def test_evaluation_without_matplotlib_writes_rows_and_tables_and_says_plots_were_skipped(data, tmp_path):
    run = _run(tmp_path / "a", data)
    out = tmp_path / "out"
    script = HIDE_MATPLOTLIB + f"""
sys.argv = ["eval/extrapolate.py"]
from regulargpt.commands.extrapolate import main
code = main({["--runs", run, "--data", str(data), "--lengths", "16,32", "--device", "cpu", "--no-progress",
             "--out", str(out)]!r})
from regulargpt.evaluation import formal_long_run, lm_trends, receptive_field, state_clusters
# every other plot of the evaluation path: nothing drawn, nothing raised (the inputs are never read)
state_clusters.plot_steps([], "{tmp_path}/c.png", "t")
receptive_field.plot_receptive_field(None, "{tmp_path}/r.png", "t")
lm_trends.plot_gap_vs_tokens({{}}, {{}}, [], "alibi", 16, 256, "{tmp_path}/g.png")
lm_trends.plot_ppl_by_budget({{}}, {{}}, [], [], "{tmp_path}/b.png")
formal_long_run.plot_curves({{}}, "{tmp_path}/f.png", "t")
sys.exit(code)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(load_rows(out / "results.jsonl")) == 2 and "Perplexity" in (out / "table.md").read_text()
    assert f"wrote {out}/results.jsonl, table.md\n" in proc.stdout
    skipped = [line for line in proc.stderr.splitlines() if "plots skipped" in line]
    assert skipped == [f"plots skipped: matplotlib is not installed (first: {out}/ppl_vs_length.png); tables and "
                       f"rows are written"]
    assert sorted(p.name for p in out.iterdir()) == ["results.jsonl", "table.md"]
    assert not list(tmp_path.glob("*.png"))


_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAIN_LEN}


def test_rope_scalings_of_one_run_are_keyed_and_labelled_apart(data: Path, tmp_path: Path) -> None:
    """Two scalings and none, of one run, into one results file: three rows per length, none overwritten (a rerun
    rescores nothing), each labelled with its scaling; the scaled rows equal a model built with the scaling."""
    from regulargpt.evaluation.lm_report import latest_rows, variant_labels
    from regulargpt.evaluation.perplexity import score_windows

    rope = _run(tmp_path / "rope", data, position="rope")
    out = tmp_path / "out"
    linear = {"rope_type": "linear", "factor": 2.0}
    for scaling in (None, _YARN, linear):
        sweep([rope], data, "test", [16, 64], out, progress=False, rope_scaling=scaling)
    assert sweep([rope], data, "test", [16, 64], out, progress=False, rope_scaling=_YARN) == []  # all done
    rows = latest_rows(load_rows(out / "results.jsonl"))
    assert [(r["rope_scaling"], r["length"]) for r in rows] == [
        (None, 16), (None, 64), (json.dumps(_YARN, sort_keys=True, separators=(",", ":")), 16),
        (json.dumps(_YARN, sort_keys=True, separators=(",", ":")), 64), ('{"factor":2.0,"rope_type":"linear"}', 16),
        ('{"factor":2.0,"rope_type":"linear"}', 64)]
    assert sorted(set(variant_labels(rows).values())) == ["RoPE", "RoPE rope=linear×2", "RoPE rope=yarn×4 from 16"]
    assert len({r["ppl"] for r in rows}) == 6
    torch.manual_seed(0)  # _run's seed: the same weights, built with the scaling
    net = build_model(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, ffn_mult=2,
                                  architecture="transformer", position="rope", rope_scaling=linear)).eval()
    tokens = np.fromfile(data / "test.bin", dtype=np.uint16)
    nll, counts = score_windows(net, tokens, plan_windows(rows[-1]["tokens"], 64, "nonoverlapping", 64), 4, "cpu")
    assert rows[-1]["ppl"] == pytest.approx(math.exp(nll.sum() / counts.sum()), rel=1e-6)
    write_report(rows, out, "python eval/extrapolate.py ...")
    assert "| RoPE rope=yarn×4 from 16 |" in (out / "table.md").read_text()


def test_bad_rope_scalings_are_errors_before_any_work(data: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cli = load_script("eval/extrapolate.py")
    rope = _run(tmp_path / "rope", data, position="rope")
    alibi = _run(tmp_path / "alibi", data)
    out = tmp_path / "out"
    for flag, message in [('{"rope_type": "ntk-by-parts", "factor": 2}', "rope_type: 'ntk-by-parts' is not accepted; "
                                                                        "expected one of 'linear', 'ntk', 'dynamic'"),
                          ('{"rope_type": "dynamic"}', "factor: missing"),
                          ("{rope_type: yarn}", "not JSON")]:
        with pytest.raises(SystemExit):
            cli.main(["--runs", rope, "--data", str(data), "--out", str(out), "--rope-scaling", flag])
        assert message in capsys.readouterr().err
    assert cli.main(["--runs", rope, alibi, "--data", str(data), "--out", str(out), "--no-progress",
                     "--rope-scaling", json.dumps(_YARN)]) == 2
    err = capsys.readouterr().err
    assert "alibi" in err and "position 'rope'" in err and "yarn×4 from 16" in err
    assert not (out / "results.jsonl").exists()  # refused before any run was scored
