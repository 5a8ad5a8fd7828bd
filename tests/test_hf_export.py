"""The Hugging Face export (regulargpt/hf/, ``launch/export.py --format hf``) against our own model and tokenizer.

For RegularGPT (each depth policy) and every dense position scheme, an untrained model saved as a run is exported;
one fresh Python process (tests/hf_load_check.py) loads every folder with transformers alone and records logits at
the training length and 4× it, greedy ``generate``, the tokenizer on the validation documents and lm-evaluation-
harness style loglikelihoods. Here they are compared with our model, ``launch/generate.py --greedy`` and
sentencepiece. The other tests are in-process: the BPE merges by hand, padding, the safetensors file, refusals,
the model card of a run with metrics and an evaluation, and that only regulargpt/hf imports transformers.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import load_script
from regulargpt.checkpoint import load_model_file, save_model_file
from regulargpt.config import load_config_dict, save_config
from regulargpt.config.sections import Position
from regulargpt.data import Tokenizer, load_manifest, open_split
from regulargpt.errors import UserError
from regulargpt.generation import SamplingConfig, generate
from regulargpt.model import build_model

ROOT = Path(__file__).resolve().parents[1]
TRAIN_LENGTH = 16
PROMPT = "def main(args):\n    "
PAIRS = [("def add(a, b):\n    return", " a + b\n"), ("import os\nimport", " sys"), ("", "class Foo:\n"),
         ("x = [1, 2, 3]\nprint(len(x", "))\n")]
# Every position scheme of the dense language models (none = NoPE); xl_relative is the formal-language classifier's
# baseline, which the language-model tools (perplexity tables, labels) do not know.
DENSE = [p for p in typing.get_args(Position) if p != "xl_relative"]
REGULAR = ["adaptive", "train", "per_position"]


def _cache(out: object) -> object:
    """The cache an output carries: its field is `cache` in transformers 5.25, `past_key_values` in 5.17."""
    return getattr(out, "cache", None) if hasattr(out, "cache") else getattr(out, "past_key_values", None)


def _save_run(root: Path, data_dir: Path, **model: object) -> Path:
    """A run directory (resolved config + model.pt) of an untrained model whose data is the prepared folder."""
    cfg = load_config_dict({"model": {"vocab_size": 512, "d_model": 32, "n_heads": 2, "chunk_size": 2, "thickness": 2,
                                      **model},
                            "data": {"path": str(data_dir), "seq_len": TRAIN_LENGTH}})
    torch.manual_seed(len(root.name))
    root.mkdir(parents=True)
    save_config(cfg, root / "config.resolved.json")
    save_model_file(root / "model.pt", cfg, build_model(cfg.model))
    return root


def _dense(position: str) -> dict[str, object]:
    extra = {"max_positions": 4 * TRAIN_LENGTH} if position == "learned" else {}
    return {"architecture": "transformer", "position": position, "n_layers": 2, **extra}


def _export(run: Path, out: Path, *flags: str) -> Path:
    assert load_script("launch/export.py").main([str(run), "--format", "hf", "--out", str(out), *flags]) == 0
    return out


def _validation_documents(data_dir: Path) -> tuple[list[str], list[list[int]]]:
    tok = Tokenizer.load(data_dir / load_manifest(data_dir)["tokenizer"]["file"])
    ids = np.asarray(open_split(data_dir, "val").tokens).tolist()
    docs, start = [], 0
    for end in [i for i, t in enumerate(ids) if t == tok.eos_id]:
        docs.append(ids[start:end])
        start = end + 1
    texts = [tok.decode(d) for d in docs] + ["</s> <s> x\t\ty  é😀 0123 ", " leading and trailing \n\n"]
    return texts, [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def exported(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, str | None]]:
    """label → (run directory, export folder, depth policy given at load time or None)."""
    root = tmp_path_factory.mktemp("hf")
    regular = _save_run(root / "runs" / "regular_gpt", data_dir, depth_policy="train")
    out = {}
    for policy in REGULAR:  # one run, exported with each depth policy stated in its config.json
        out[f"regular_gpt-{policy}"] = (regular, _export(regular, root / "hf" / f"regular_gpt-{policy}",
                                                         "--depth-policy", policy), None)
    out["regular_gpt-load-adaptive"] = (regular, out["regular_gpt-train"][1], "adaptive")  # chosen at load time
    for position in DENSE:
        run = _save_run(root / "runs" / position, data_dir, **_dense(position))
        out[position] = (run, _export(run, root / "hf" / position), None)
    # the windowed baseline (issue 28): W = 8 < the 16- and 64-token checks, so cached decoding runs its W-slot ring
    run = _save_run(root / "runs" / "rope-w8", data_dir, **_dense("rope"), window=8)
    out["rope-w8"] = (run, _export(run, root / "hf" / "rope-w8"), None)
    return out


def _ours(run: Path, policy: str | None) -> tuple[torch.nn.Module, Tokenizer]:
    _, model, _ = load_model_file(run / "model.pt", model_overrides={"depth_policy": policy} if policy else None)
    cfg = load_config_dict(json.loads((run / "config.resolved.json").read_text()))
    return model, Tokenizer.load(Path(cfg.data.path) / "tokenizer.model")


def _our_loglikelihood(model: torch.nn.Module, tok: Tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """Sum of log p(continuation token | everything before it) with our tokenizer and model (context ids, then the
    ids of context + continuation past them; an empty context reads the eos id)."""
    context_ids = tok.encode(context) if context else [tok.eos_id]
    cont = tok.encode(context + continuation)[len(context_ids):] if context else tok.encode(continuation)
    ids = torch.tensor([context_ids + cont])
    with torch.no_grad():
        logprobs = model(ids[:, :-1]).log_softmax(-1)[0, -len(cont):]  # (n, V)
    target = torch.tensor(cont)
    return float(logprobs.gather(-1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all())


@pytest.mark.slow
def test_a_fresh_process_with_only_the_folders_matches_our_model_generate_cli_and_tokenizer(
        exported: dict[str, tuple[Path, Path, str | None]], data_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    texts, text_ids = _validation_documents(data_dir)
    gen = torch.Generator().manual_seed(0)
    ids = {"at_train_length": torch.randint(4, 512, (2, TRAIN_LENGTH), generator=gen).tolist(),
           "at_4x": torch.randint(4, 512, (2, 4 * TRAIN_LENGTH), generator=gen).tolist()}
    folders = [str(folder) for _, folder, _ in exported.values()]
    request = {"root": str(ROOT), "folders": folders, "depth_policies": [p for *_, p in exported.values()],
               "ids": ids, "prompt": PROMPT, "documents": texts, "pairs": PAIRS}
    (tmp_path / "request.json").write_text(json.dumps(request))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "hf_load_check.py"), str(tmp_path / "request.json"),
                           str(tmp_path / "out.pt")], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = torch.load(tmp_path / "out.pt", weights_only=True)
    assert "install the regulargpt package" in result["without_regulargpt"]
    cli = load_script("launch/generate.py")
    for (label, (run, folder, load_policy)), got in zip(exported.items(), result["folders"]):
        assert got["doc_ids"] == text_ids, label  # sentencepiece's ids for every document
        assert got["doc_text"] == texts, label  # and back to the same text, nothing added or stripped
        policy = load_policy or json.loads((folder / "config.json").read_text())["depth_policy"]
        model, tok = _ours(run, policy)
        for name, batch in ids.items():
            with torch.no_grad():
                want = model(torch.tensor(batch))
            for key in (name, name + "_no_cache"):
                err = (got[key] - want).abs().max() / want.abs().max()
                assert err <= 1e-5, (label, key, float(err))
            assert got[name + "_cache"] == "DecoderCache", label
        prompt = tok.encode(PROMPT)
        new = got["generated"][len(prompt):]
        assert got["generated"][:len(prompt)] == prompt
        assert new == generate(model, prompt, 40, SamplingConfig(greedy=True), eos_id=tok.eos_id)[0], label
        flags = ["--depth-policy", policy] if policy else []
        assert cli.main([str(run), "--prompt", PROMPT, "--max-new-tokens", "40", "--greedy", *flags]) == 0
        shown = new[:-1] if new and new[-1] == tok.eos_id else new
        assert capsys.readouterr().out == tok.decode(prompt + shown) + "\n", label
        for (context, continuation), (ll, greedy) in zip(PAIRS, got["loglikelihood"]):
            want_ll, want_greedy = _our_loglikelihood(model, tok, context, continuation)
            assert abs(ll - want_ll) <= 1e-4 * max(1.0, abs(want_ll)) and greedy == want_greedy, (label, context)


def test_bpe_merges_rank_every_two_piece_split_by_the_merged_score() -> None:
    from regulargpt.hf.tokenizer import bpe_merges

    pieces = [("a", -1.0), ("b", -2.0), ("c", -3.0), ("ab", -4.0), ("bc", -5.0), ("abc", -6.0), ("abb", -7.0)]
    # "abc" = ab|c or a|bc: both at its score, ordered by the ids of (left, right)
    assert bpe_merges(pieces) == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c"), ("ab", "b")]


def test_hf_tokenizer_refuses_a_model_it_cannot_reproduce(data_dir: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2

    from regulargpt.data import DataError
    from regulargpt.hf.tokenizer import fast_tokenizer

    proto = sentencepiece_model_pb2.ModelProto.FromString((data_dir / "tokenizer.model").read_bytes())
    proto.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    proto.normalizer_spec.add_dummy_prefix = True
    with pytest.raises(DataError, match="model_type is not bpe; add_dummy_prefix is on"):
        fast_tokenizer(Tokenizer(proto.SerializeToString()))


def test_config_derives_the_standard_fields_and_validates_like_a_run_config() -> None:
    from regulargpt.config import ConfigError
    from regulargpt.hf.configuration import RegularGPTConfig

    dense = RegularGPTConfig(regulargpt={"architecture": "transformer", "position": "learned", "max_positions": 64,
                                         "n_layers": 3, "d_model": 48, "n_heads": 4, "vocab_size": 100})
    assert (dense.vocab_size, dense.hidden_size, dense.num_attention_heads, dense.num_hidden_layers,
            dense.max_position_embeddings) == (100, 48, 4, 3, 64)
    regular = RegularGPTConfig(regulargpt={"thickness": 3, "train_length": 16}, depth_policy="train")
    assert regular.num_hidden_layers == 3 and regular.model_config.depth_policy == "train"
    assert not hasattr(regular, "max_position_embeddings")  # any length: tools use their own default, not None
    with pytest.raises(ConfigError, match="model.depth_policy: 'train' is not allowed"):
        RegularGPTConfig(regulargpt={"architecture": "transformer"}, depth_policy="train")
    with pytest.raises(ConfigError, match="model.windw: unknown key"):
        RegularGPTConfig(regulargpt={"windw": 8})


def test_right_padding_gives_each_rows_own_logits_and_left_padding_is_refused(data_dir: Path) -> None:
    from regulargpt.hf.configuration import RegularGPTConfig
    from regulargpt.hf.modeling import RegularGPTForCausalLM, right_padded_lengths

    assert right_padded_lengths(torch.tensor([[1, 1, 1], [1, 1, 0]]), 3) == [3, 2]
    assert right_padded_lengths(torch.ones(2, 3), 3) is None
    with pytest.raises(ValueError, match="only padding on the right"):
        right_padded_lengths(torch.tensor([[0, 1, 1]]), 3)
    for policy in ("adaptive", "per_position"):  # adaptive: depth follows the length, rows run alone
        cfg = load_config_dict({"model": {"vocab_size": 64, "d_model": 16, "n_heads": 2, "depth_policy": policy},
                                "data": {"seq_len": 8}})
        model = RegularGPTForCausalLM(RegularGPTConfig(regulargpt=dataclasses.asdict(cfg.model))).eval()
        ids = torch.randint(0, 64, (2, 9))
        mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
        with torch.no_grad():
            out = model(ids, attention_mask=mask)
            assert _cache(out) is None  # a padded batch is scored without a cache
            assert torch.allclose(out.logits[1, :5], model.model(ids[1:, :5])[0], atol=1e-6)
            assert torch.allclose(out.logits[0], model.model(ids[:1])[0], atol=1e-6)
            with pytest.raises(ValueError, match="cannot continue from a cache"):
                model(ids[:, -1:], attention_mask=mask, cache=_cache(model(ids)))


def test_labels_give_the_shifted_next_token_loss_with_gradients() -> None:
    from regulargpt.hf.configuration import RegularGPTConfig
    from regulargpt.hf.modeling import RegularGPTForCausalLM

    model = RegularGPTForCausalLM(RegularGPTConfig(regulargpt={"vocab_size": 64, "d_model": 16, "n_heads": 2,
                                                               "architecture": "transformer", "position": "alibi"}))
    ids = torch.randint(0, 64, (2, 7))
    out = model(ids, labels=ids)
    want = torch.nn.functional.cross_entropy(model.model(ids)[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    assert torch.allclose(out.loss, want, atol=1e-6) and _cache(out) is None
    out.loss.backward()
    assert model.model.embed.table.weight.grad is not None


def test_generate_decodes_through_our_cache_and_refuses_beam_search() -> None:
    from regulargpt.generation import GenerationError
    from regulargpt.hf.cache import DecoderCache
    from regulargpt.hf.configuration import RegularGPTConfig
    from regulargpt.hf.modeling import RegularGPTForCausalLM

    model = RegularGPTForCausalLM(RegularGPTConfig(regulargpt={"vocab_size": 64, "d_model": 16, "n_heads": 2,
                                                               "train_length": 8, "depth_policy": "train"},
                                                   eos_token_id=2, pad_token_id=3)).eval()
    ids = torch.randint(4, 64, (1, 5))
    out = model.generate(ids, do_sample=False, max_new_tokens=6, return_dict_in_generate=True)
    assert isinstance(_cache(out), DecoderCache) and _cache(out).get_seq_length() == out.sequences.shape[1] - 1
    assert model.generate(ids, do_sample=True, num_return_sequences=3, max_new_tokens=6).shape[0] == 3
    with pytest.raises(GenerationError, match="beam search"):
        model.generate(ids, num_beams=2, do_sample=False, max_new_tokens=6)


def test_safetensors_format_holds_the_state_dict_and_config(data_dir: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    run = _save_run(tmp_path / "tied", data_dir, architecture="transformer", position="rope", n_layers=1,
                    tie_embeddings=True)
    assert load_script("launch/export.py").main([str(run), "--format", "safetensors"]) == 0
    cfg, model, _ = load_model_file(run / "model.pt")
    tensors = load_file(run / "model.safetensors")
    assert tensors.keys() == model.state_dict().keys()
    assert all(torch.equal(tensors[k], v) for k, v in model.state_dict().items())
    with safe_open(run / "model.safetensors", "pt") as f:
        saved = load_config_dict(json.loads(f.metadata()["config"]))
    assert saved == cfg


def test_refusals_are_one_line_errors(data_dir: Path, tmp_path: Path) -> None:
    cli = load_script("launch/export.py")
    run = _save_run(tmp_path / "run", data_dir)
    dense = _save_run(tmp_path / "dense", data_dir, **_dense("t5"))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    classifier = tmp_path / "formal" / "model.pt"
    classifier.parent.mkdir()
    from helpers import tiny_cfg

    formal = tiny_cfg()
    save_model_file(classifier, formal, build_model(formal.model))
    cases = [([str(run), "--format", "hf", "--out", str(tmp_path / "taken")], "not an earlier regulargpt export"),
             ([str(run), "--eval", str(tmp_path)], "options of --format hf"),
             ([str(classifier), "--format", "hf"], "sequence classifier"),
             ([str(run), "--format", "hf", "--eval", str(tmp_path / "none.jsonl")], "no results file"),
             ([str(run), "--format", "hf", "--step", "3"], "no checkpoint global_step3"),
             ([str(dense), "--format", "hf", "--depth-policy", "train"], "the depth policy is RegularGPT's")]
    for argv, message in cases:
        with pytest.raises(UserError, match=message):
            cli.main(argv)
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_model_card_states_the_runs_knobs_data_training_and_evaluation(data_dir: Path, tmp_path: Path) -> None:
    from regulargpt.evaluation.length_sweep import sweep

    run = _save_run(tmp_path / "alibi-seed0", data_dir, **_dense("alibi"))
    rows = [{"step": 10, "loss": 6.0, "tokens": 2560}, {"step": 20, "loss": 5.5, "tokens": 5120, "val_loss": 5.4321}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scored = sweep([run], data_dir, "val", [16, 64], tmp_path / "eval", progress=False)
    out = _export(run, tmp_path / "card", "--eval", str(tmp_path / "eval"))
    card = (out / "README.md").read_text()
    assert "# ALiBi: alibi-seed0" in card and "| `position` | `\"alibi\"` |" in card
    assert "5.4321 nats/token at step 20" in card and "Tokens seen: 5,120" in card
    assert f"--config {run / 'config.resolved.json'} --run-dir {run}" in card
    manifest = load_manifest(data_dir)
    assert manifest["tokenizer"]["sha256"] in card and f"{manifest['splits']['val']['tokens']:,}" in card
    assert "| L=16 | L=64 |" in card
    assert " | ".join(f"{r['ppl']:.3f}" for r in scored) in card
    assert f"launch/export.py {run} --format hf --out {out} --eval" in card
    assert _export(run, out) == out  # an earlier export is replaced


def test_only_regulargpt_hf_imports_transformers() -> None:
    """transformers is optional (the dev extra): no module outside regulargpt/hf imports it, anywhere in its file."""
    importers = []
    for path in sorted((ROOT / "regulargpt").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "transformers" or n.startswith("transformers.") for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers and all(p.startswith("regulargpt/hf/") for p in importers), importers


def test_leftovers_of_killed_exports_go_at_the_next_start_and_a_set_aside_export_comes_back(
        data_dir: Path, tmp_path: Path) -> None:
    """Issue 37 §3: what an export killed mid-write left (`.<name>.<pid>.tmp` files, `.<name>.<pid>.tmp-*` folders of
    an ended pid) is removed when the next export starts, also when that export then fails; a running writer's and
    other names stay. An earlier hf export set aside as `.hf.old` by an export killed between its two renames
    comes back."""
    from regulargpt.hf.export import _recover

    cli = load_script("launch/export.py")
    run = _save_run(tmp_path / "run", data_dir, **_dense("rope"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    gone = [f".model.pt.{dead}.tmp", f".model.safetensors.{dead}.tmp", f".hf.{dead}.tmp-k2j4x9"]
    stay = [f".model.pt.{os.getpid()}.tmp", ".model.pt.tmp", f".other.{dead}.tmp", f".hf.{dead}.tmpfile"]
    for name in gone + stay:
        (run / name).mkdir() if name.startswith(".hf") else (run / name).write_bytes(b"partial weights")
    with pytest.raises(UserError, match="no checkpoint yet"):  # a run without checkpoints: nothing to consolidate
        cli.main([str(run)])
    assert cli.main([str(run), "--format", "safetensors"]) == 0
    assert cli.main([str(run), "--format", "hf", "--out", str(run / "hf")]) == 0
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == sorted(stay)
    (run / "hf").rename(run / ".hf.old")  # killed after setting the earlier export aside, before the new one moved in
    _recover(run / "hf")
    assert (run / "hf" / "config.json").is_file() and not (run / ".hf.old").exists()


def test_the_cache_field_is_read_off_the_output_class_not_the_version() -> None:
    """transformers 5.17's CausalLMOutputWithPast names the cache `past_key_values`, 5.25's `cache` (issue 39 §3:
    `cache=` raised TypeError under 5.17). Fake output classes with either field, and the installed one."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from regulargpt.hf.modeling import cache_field

    @dataclasses.dataclass
    class Old:
        loss: object = None
        logits: object = None
        past_key_values: object = None

    @dataclasses.dataclass
    class New:
        loss: object = None
        logits: object = None
        cache: object = None

    assert cache_field(Old) == "past_key_values" and cache_field(New) == "cache"
    names = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    assert cache_field() in names  # the installed transformers, whichever release it is
    out = CausalLMOutputWithPast(logits=torch.zeros(1), **{cache_field(): "the cache"})
    assert _cache(out) == "the cache"


def test_rope_scaling_given_at_export_is_in_config_json_and_the_loaded_model_runs_with_it(data_dir: Path,
                                                                                          tmp_path: Path) -> None:
    """``--rope-scaling`` goes into config.json's regulargpt object; the folder's model has our scaled model's
    logits (same weights), which differ from the unscaled ones past the trained length."""
    from regulargpt.evaluation.scored_run import load_run
    from regulargpt.hf.configuration import RegularGPTConfig
    from regulargpt.hf.modeling import RegularGPTForCausalLM

    run = _save_run(tmp_path / "rope", data_dir, **_dense("rope"))
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAIN_LENGTH}
    out = _export(run, tmp_path / "hf", "--rope-scaling", json.dumps(scaling))
    assert json.loads((out / "config.json").read_text())["regulargpt"]["rope_scaling"] == scaling
    hf = RegularGPTForCausalLM.from_pretrained(out, config=RegularGPTConfig.from_pretrained(out)).eval()
    ids = torch.randint(0, 512, (1, 4 * TRAIN_LENGTH))
    with torch.no_grad():
        ours = load_run(run, rope_scaling=scaling).model(ids)
        torch.testing.assert_close(hf(ids, use_cache=False).logits, ours, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(load_run(run).model(ids), ours, atol=1e-3)
    with pytest.raises(UserError, match=r"rope_scaling.*position 'rope'"):
        _export(_save_run(tmp_path / "alibi", data_dir, **_dense("alibi")), tmp_path / "hf2", "--rope-scaling",
                json.dumps(scaling))
