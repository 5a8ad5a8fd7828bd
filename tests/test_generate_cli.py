"""launch/generate.py: the tokenizer found through the run's data manifest, same seed → same text, --stream prints
what the batch run prints, greedy text equals the library's greedy ids, and every bad input is one `error:` line
with exit status 2."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from regulargpt.checkpoint import save_model_file
from regulargpt.config import load_config_dict
from regulargpt.data import Tokenizer, load_manifest
from regulargpt.errors import UserError
from regulargpt.generation import SamplingConfig, generate
from regulargpt.model import build_model
from helpers import tiny_cfg

ROOT = Path(__file__).resolve().parents[1]


def _cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_cli", ROOT / "launch" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_dir(root: Path, data_dir: Path, **model: object) -> Path:
    """A run directory with a random-weight model.pt whose config points at the prepared data folder."""
    cfg = load_config_dict({"model": {"vocab_size": 512, "d_model": 32, "n_heads": 2, "chunk_size": 2,
                                      "thickness": 2, **model},
                            "data": {"path": str(data_dir), "seq_len": 16}})
    torch.manual_seed(0)
    root.mkdir(parents=True)
    save_model_file(root / "model.pt", cfg, build_model(cfg.model))
    return root


@pytest.fixture(scope="module")
def run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_dir(tmp_path_factory.mktemp("gen") / "rgpt", data_dir, depth_policy="train")


def _text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert _cli().main(list(argv)) == 0
    return capsys.readouterr().out


def test_same_seed_same_text_and_stream_prints_the_same(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(run), "--prompt", "def ", "--max-new-tokens", "20", "--temperature", "1.0"]
    first = _text(capsys, *args, "--seed", "3")
    assert first.startswith("def ") and len(first) > len("def \n")
    assert _text(capsys, *args, "--seed", "3") == first
    assert _text(capsys, *args, "--seed", "3", "--stream") == first
    assert _text(capsys, *args, "--seed", "4") != first
    three = _text(capsys, *args, "--seed", "3", "--num-samples", "3")
    assert three.count("--- sample ") == 3


def test_greedy_text_is_the_librarys_greedy_ids(run: Path, data_dir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    tok = Tokenizer.load(data_dir / load_manifest(data_dir)["tokenizer"]["file"])
    out = _text(capsys, str(run / "model.pt"), "--prompt", "import ", "--max-new-tokens", "15", "--greedy",
                "--depth-policy", "per_position")
    model = build_model(load_config_dict({"model": {"vocab_size": 512, "d_model": 32, "n_heads": 2,
                                                    "chunk_size": 2, "thickness": 2, "depth_policy": "per_position"},
                                          "data": {"seq_len": 16}}).model)
    model.load_state_dict(torch.load(run / "model.pt", weights_only=True)["state_dict"])
    ids = generate(model.eval(), tok.encode("import "), 15, SamplingConfig(greedy=True), eos_id=tok.eos_id)[0]
    ids = ids[:-1] if ids and ids[-1] == tok.eos_id else ids
    assert out == tok.decode(tok.encode("import ") + ids) + "\n"


def test_bad_input_is_one_error_line(run: Path, data_dir: Path, tmp_path: Path) -> None:
    learned = _run_dir(tmp_path / "learned", data_dir, architecture="transformer", position="learned",
                       max_positions=16, n_layers=1)
    small = _run_dir(tmp_path / "small", data_dir, vocab_size=40)
    classifier = tmp_path / "parity.pt"  # what launch/train_formal.py writes
    save_model_file(classifier, tiny_cfg(), build_model(tiny_cfg().model))
    cli = _cli()
    cases = [
        ([str(run), "--prompt", ""], "prompt is empty"),
        ([str(run), "--prompt", "x", "--temperature", "0"], "temperature must be > 0"),
        ([str(small), "--prompt", "def main():"], "outside the model's vocabulary"),
        ([str(learned), "--prompt", "def f(x):", "--max-new-tokens", "40"], "max_positions=16"),
        ([str(tmp_path / "nothing"), "--prompt", "x"], "does not exist"),
        ([str(run), "--prompt", "x", "--tokenizer", str(tmp_path / "none.model")], "does not exist"),
        ([str(run), "--prompt", "x", "--stream", "--num-samples", "2"], "--num-samples 1"),
        ([str(classifier), "--prompt", "x"], r"a sequence classifier \(head 'classifier'\), not a language model; "
                                             r"perplexity and generation need"),
    ]
    for argv, message in cases:
        with pytest.raises(UserError, match=message):
            cli.main(argv)
    assert cli.main([str(run), "--prompt", "x", "--temperature", "0", "--greedy", "--max-new-tokens", "2"]) == 0
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "generate.py"), str(run), "--prompt", ""],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: the prompt")



def test_stale_model_pt_is_refused_and_stderr_names_the_weights_and_the_speed(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model.pt exported at step 0 in a run whose newest checkpoint is step 96 is refused; the file named
    explicitly generates, and stderr says which weights (step, sha256), the note, tokens/s and the cache size."""
    from regulargpt.evaluation.run_weights import weights_sha256

    run = _run_dir(tmp_path / "run", data_dir, depth_policy="train")
    saved = torch.load(run / "model.pt", weights_only=True)
    torch.save({**saved, "meta": {"step": 0}}, run / "model.pt")  # as launch/export.py writes it at step 0
    (run / "global_step96").mkdir()
    (run / "latest").write_text("global_step96")
    with pytest.raises(UserError, match=r"step 0, but the run's newest checkpoint is step 96"):
        _cli().main([str(run), "--prompt", "x"])
    assert _cli().main([str(run / "model.pt"), "--prompt", "def ", "--max-new-tokens", "5", "--greedy"]) == 0
    err = capsys.readouterr().err
    sha = weights_sha256(torch.load(run / "model.pt", weights_only=True)["state_dict"])
    assert f"step 0, weights sha256 {sha[:12]}" in err and "the run's newest checkpoint is step 96" in err
    assert "tokens/s" in err and " MiB at " in err


def test_rope_scaling_decodes_with_the_scaled_model_and_refuses_a_model_without_rope(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--rope-scaling: greedy text equals the library's greedy ids of the model built with that scaling (dynamic
    NTK: cached keys re-rotated at each step); a scaling on an ALiBi run and a bad rope_type are errors."""
    import json

    rope = _run_dir(tmp_path / "rope", data_dir, architecture="transformer", position="rope", n_layers=1)
    scaling = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 8}
    tok = Tokenizer.load(data_dir / load_manifest(data_dir)["tokenizer"]["file"])
    out = _text(capsys, str(rope), "--prompt", "import os", "--max-new-tokens", "20", "--greedy",
                "--rope-scaling", json.dumps(scaling))
    model = build_model(load_config_dict({"model": {"vocab_size": 512, "d_model": 32, "n_heads": 2, "n_layers": 1,
                                                    "architecture": "transformer", "position": "rope",
                                                    "rope_scaling": scaling}}).model)
    model.load_state_dict(torch.load(rope / "model.pt", weights_only=True)["state_dict"])
    prompt = tok.encode("import os")
    ids = torch.tensor([prompt])
    with torch.no_grad():  # greedy by full forwards of each prefix: the truth for a length-dependent rotation
        for _ in range(20):
            ids = torch.cat([ids, model.eval()(ids)[:, -1:].argmax(-1)], dim=1)
    new = ids[0, len(prompt):].tolist()
    new = new[:new.index(tok.eos_id)] if tok.eos_id in new else new
    assert out == tok.decode(prompt + new) + "\n"
    alibi = _run_dir(tmp_path / "alibi", data_dir, architecture="transformer", position="alibi", n_layers=1)
    with pytest.raises(UserError, match=r"rope_scaling.*position 'rope'"):
        _cli().main([str(alibi), "--prompt", "x", "--rope-scaling", json.dumps(scaling)])
    with pytest.raises(SystemExit):
        _cli().main([str(rope), "--prompt", "x", "--rope-scaling", '{"rope_type": "su", "factor": 2}'])
    assert "rope_type: 'su' is not accepted" in capsys.readouterr().err
