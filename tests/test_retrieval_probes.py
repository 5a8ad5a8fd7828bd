"""Retrieval probes (regulargpt.evaluation.retrieval_probes, probe_sweep, eval/extrapolate.py --probe): the passkey
text holds the key at the stated depth (checked by decoding), hand-built oracle "models" whose answers are known
give exactly the predicted accuracy tables, effective length by hand, rows keyed apart from perplexity rows, and
the bad-input errors."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from helpers import load_script
from regulargpt.checkpoint import save_model_file
from regulargpt.config import load_config_dict, save_config
from regulargpt.data import Tokenizer, load_manifest
from regulargpt.evaluation.lm_report import load_rows
from regulargpt.model import build_model
from regulargpt.evaluation.retrieval_probes import (COPY_SPAN, DISTRACTORS, FILLER, INTRO, QUESTION, copy_case,
                                                    effective_length, passkey_case, probe_accuracy)

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _tok(data_dir: Path) -> Tokenizer:
    return Tokenizer.load(data_dir / load_manifest(data_dir)["tokenizer"]["file"])


@pytest.mark.parametrize("length", [128, 300])
@pytest.mark.parametrize("depth", DEPTHS)
def test_the_passkey_text_holds_the_key_at_the_stated_depth(data_dir: Path, length: int, depth: float) -> None:
    tok = _tok(data_dir)
    case = passkey_case(tok, length, depth, seed=3, trial=1)
    rows = case.candidates.tolist()
    assert case.candidates.shape == (1 + DISTRACTORS, length + 1)
    text = tok.decode(rows[0])
    [key] = re.findall(r"The pass key is (\d{5})\. Remember it\. ", text)
    assert text.startswith(INTRO) and text.endswith(QUESTION + key)
    answers = {tok.decode(r[case.score_from:]) for r in rows}
    assert len(answers) == 1 + DISTRACTORS and all(re.fullmatch(r"\d{5}", a) for a in answers)
    assert all(r[:case.score_from] == rows[0][:case.score_from] for r in rows)  # one prompt, ten answers
    # by hand: the filler room F is what the fixed segments leave of L + 1 tokens; the key sits after round(δ·F)
    fixed = len(tok.encode(INTRO)) + len(tok.encode(f"The pass key is {key}. Remember it. ")) + \
        len(tok.encode(QUESTION)) + 5
    room = length + 1 - fixed
    start = len(tok.encode(INTRO)) + round(depth * room)
    assert case.answer_at == start
    assert tok.decode(rows[0][start:]).startswith(f"The pass key is {key}.")
    assert (FILLER * 50).startswith(tok.decode(rows[0][len(tok.encode(INTRO)):start]))


def _reader(tok: Tokenizer, window: int):
    """A passkey oracle that reads only its last `window` input tokens: when they hold "The pass key is DDDDD." it
    puts logit 10 on digit j of that key at input position T − 5 + j (where the answer's digits are predicted)."""
    def logits_of(ids: torch.Tensor) -> torch.Tensor:
        batch, length = ids.shape
        out = torch.zeros(batch, length, tok.vocab_size)
        for b in range(batch):
            found = re.search(r"The pass key is (\d{5})\.", tok.decode(ids[b, max(0, length - window):].tolist()))
            if found:
                for j, digit in enumerate(found.group(1)):
                    out[b, length - 5 + j, tok.encode(digit)[0]] = 10.0
        return out
    return logits_of


def _induction(window: int):
    """A copy oracle: at position t, predict the token after the latest earlier occurrence of x_t within the last
    `window` positions (one-hot logit); no occurrence → all zeros (argmax id 0, never a probe token)."""
    def logits_of(ids: torch.Tensor) -> torch.Tensor:
        batch, length = ids.shape
        out = torch.zeros(batch, length, 4096)
        for b in range(batch):
            row = ids[b].tolist()
            for t in range(length):
                for j in range(t - 1, max(-1, t - window - 1), -1):
                    if row[j] == row[t]:
                        out[b, t, row[j + 1]] = 1.0
                        break
        return out
    return logits_of


@pytest.mark.parametrize("window", [40, 100])
def test_oracles_give_exactly_the_predicted_accuracy(data_dir: Path, window: int) -> None:
    tok = _tok(data_dir)
    for length in (128, 192):
        got = probe_accuracy(_reader(tok, window), "passkey", tok, length, DEPTHS, trials=3, seed=0)
        # the reader sees the key iff it starts within its last `window` inputs: distance L − start <= window
        assert [d["accuracy"] for d in got] == [1.0 if d["distance"] <= window else 0.0 for d in got]
        assert [d["distance"] for d in got] == [length - passkey_case(tok, length, dd, 0, 0).answer_at for dd in DEPTHS]
        got = probe_accuracy(_induction(window), "copy", tok, length, DEPTHS, trials=2, seed=0)
        # the copies start D = (L + 1 − m) − round(δ·(L + 1 − 2m)) apart: copied iff D <= window
        distance = [(length + 1 - COPY_SPAN) - round(d * (length + 1 - 2 * COPY_SPAN)) for d in DEPTHS]
        assert [d["accuracy"] for d in got] == [1.0 if D <= window else 0.0 for D in distance]
    assert {d["accuracy"] for d in probe_accuracy(_reader(tok, 10_000), "passkey", tok, 128, DEPTHS, 2, 1)} == {1.0}


def test_copy_span_is_distinct_and_absent_from_the_filler() -> None:
    case = copy_case(list(range(4, 300)), 100, 0.5, seed=0, trial=0)
    seq = case.candidates[0].tolist()
    span = seq[-COPY_SPAN:]
    assert len(set(span)) == COPY_SPAN and seq[case.answer_at:case.answer_at + COPY_SPAN] == span
    rest = seq[:case.answer_at] + seq[case.answer_at + COPY_SPAN:-COPY_SPAN]
    assert not set(rest) & set(span) and len(seq) == 101 and case.answer_at == round(0.5 * (101 - 32))


def test_effective_length_by_hand() -> None:
    table = {64: 1.0, 128: 0.95, 256: 0.5, 512: 0.92}
    assert effective_length(table, 0.9) == 128  # 512 is above again, but 256 broke the run
    assert effective_length(table, 0.4) == 512
    assert effective_length(table, 0.96) == 64
    assert effective_length(table, 1.01) is None
    assert effective_length({64: 0.9}, 0.9) == 64  # "at or above"


def _run(root: Path, data_dir: Path, **model: object) -> str:
    cfg = load_config_dict({"model": {"vocab_size": 512, "d_model": 16, "n_heads": 2, "n_layers": 1,
                                      "architecture": "transformer", "position": "alibi", **model},
                            "data": {"path": str(data_dir), "seq_len": 64}})
    root.mkdir(parents=True)
    save_config(cfg, root / "config.resolved.json")
    save_model_file(root / "model.pt", cfg, build_model(cfg.model), {"step": 0})
    return str(root)


def test_probe_rows_share_the_results_file_keyed_apart_and_resume(data_dir: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    main = load_script("eval/extrapolate.py").main
    run, out = _run(tmp_path / "r", data_dir), tmp_path / "out"
    args = ["--runs", run, "--data", str(data_dir), "--lengths", "96,128", "--tokens", "1024", "--out", str(out),
            "--device", "cpu", "--no-progress", "--probe-trials", "2"]
    assert main(args + ["--probe", "passkey", "--probe", "copy"]) == 0
    rows = load_rows(out / "results.jsonl")
    assert sorted((r.get("probe") or "", r["length"]) for r in rows) == sorted(
        [("", 96), ("", 128), ("copy", 96), ("copy", 128), ("passkey", 96), ("passkey", 128)])
    table = (out / "table.md").read_text()
    assert "## data · passkey probe" not in table and "passkey probe" in table and "effective length" in table
    capsys.readouterr()
    assert main(args + ["--probe", "passkey,copy"]) == 0  # nothing new: no row appended
    assert len(load_rows(out / "results.jsonl")) == 6 and " · passkey L=" not in capsys.readouterr().out


def test_bad_probe_input_fails_before_any_work(data_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    main = load_script("eval/extrapolate.py").main
    learned = _run(tmp_path / "learned", data_dir, position="learned", max_positions=128)
    out = tmp_path / "out"
    base = ["--data", str(data_dir), "--out", str(out), "--device", "cpu", "--no-progress"]
    assert main(["--runs", learned, "--lengths", "128,256,512", "--probe", "passkey", *base]) == 2
    err = capsys.readouterr().err
    assert "max_positions=128" in err and "256, 512" in err and not out.exists()
    assert main(["--runs", learned, "--lengths", "128", "--probe", "passkey,needle", *base]) == 2
    assert "--probe needle: unknown probe; accepted: passkey, copy" in capsys.readouterr().err and not out.exists()
    assert main(["--runs", learned, "--lengths", "16", "--probe", "copy", *base]) == 2
    assert "--probe copy: length 16 is too short" in capsys.readouterr().err and not out.exists()


def test_probes_under_a_rope_scaling_are_keyed_apart_and_score_the_scaled_model(data_dir: Path,
                                                                                tmp_path: Path) -> None:
    import dataclasses
    import json

    from regulargpt.config import load_config
    from regulargpt.config.rope_scaling import check_rope_scaling

    main = load_script("eval/extrapolate.py").main
    run, out = _run(tmp_path / "rope", data_dir, position="rope"), tmp_path / "out"
    yarn = {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64}
    args = ["--runs", run, "--data", str(data_dir), "--lengths", "96", "--tokens", "512", "--out", str(out),
            "--device", "cpu", "--no-progress", "--probe", "passkey", "--probe-trials", "3"]
    assert main(args) == 0
    assert main(args + ["--rope-scaling", json.dumps(yarn)]) == 0
    probes = [r for r in load_rows(out / "results.jsonl") if r.get("probe")]
    assert [r["rope_scaling"] is None for r in probes] == [True, False]  # the scaled row replaced nothing
    scaled = probes[1]
    assert json.loads(scaled["rope_scaling"]) == check_rope_scaling(yarn)
    assert scaled["variant"] != probes[0]["variant"] and "rope=yarn×4 from 64" in (out / "table.md").read_text()
    # independent truth: the same weights in a model built from a config that carries the scaling itself
    cfg = load_config(Path(run) / "config.resolved.json")
    model = build_model(dataclasses.replace(cfg.model, rope_scaling=check_rope_scaling(yarn)))
    model.load_state_dict(torch.load(Path(run) / "model.pt", weights_only=False)["state_dict"])
    expected = probe_accuracy(model.eval(), "passkey", _tok(data_dir), 96, DEPTHS, 3, 0, "cpu")
    assert [d["accuracy"] for d in scaled["by_depth"]] == pytest.approx([d["accuracy"] for d in expected])
    assert main(args + ["--rope-scaling", json.dumps(yarn)]) == 0  # resumes: both rows done
    assert len([r for r in load_rows(out / "results.jsonl") if r.get("probe")]) == 2


def test_a_rope_scaling_on_a_probe_of_a_model_without_rope_is_an_error(data_dir: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    main = load_script("eval/extrapolate.py").main
    run, out = _run(tmp_path / "alibi", data_dir), tmp_path / "out"
    assert main(["--runs", run, "--data", str(data_dir), "--lengths", "96", "--out", str(out), "--device", "cpu",
                 "--no-progress", "--probe", "passkey", "--rope-scaling", '{"rope_type": "linear", "factor": 2}']) == 2
    assert "--rope-scaling" in capsys.readouterr().err and not (out / "results.jsonl").exists()
