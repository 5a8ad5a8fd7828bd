"""The §7 analyses: spans of RegularGPT's kept states (vs brute-force perturbation), span transitions (vs the task's
own labels), PCA / k-means / silhouette / purity (vs hand-made data and hand-computed values), input-gradient maps
(vs an analytic model and finite differences) and both CLIs end to end on tiny model files."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from regulargpt.checkpoint import save_model_file
from regulargpt.config import Config, DataConfig, FormalConfig, FormalDataConfig, ModelConfig
from regulargpt.evaluation.probes import input_gradient_norms, pad_chain, span_transitions, tree_spans, tree_states
from regulargpt.evaluation.receptive_field import lm_batch, receptive_field
from regulargpt.evaluation.state_clusters import choose_k, kmeans, pca, purity, silhouette
from regulargpt.model import build_model
from regulargpt.tasks import make_task
from helpers import HAS_MATPLOTLIB, load_script

ROOT = Path(__file__).resolve().parents[1]


def _classifier(chunk: int, thickness: int, vocab: int = 3, classes: int = 2, d: int = 8) -> nn.Module:
    cfg = ModelConfig(architecture="regular_gpt", head="classifier", vocab_size=vocab, num_classes=classes,
                      d_model=d, n_heads=2, chunk_size=chunk, thickness=thickness, norm="post", activation="relu",
                      embedding_scale=True, init_std=0.2)
    return build_model(cfg).double().eval()


# ------------------------------------------------------------------------------------------------- spans, states


def test_tree_spans_worked_example() -> None:
    spans = tree_spans(5, 2, 1)  # C=2, K=1, T=5: the module docstring's example
    assert [(s.start.tolist(), s.end.tolist()) for s in spans] == [([0, 1, 3], [0, 2, 4]), ([0, 1], [0, 4]),
                                                                   ([0], [4])]


@pytest.mark.parametrize("chunk,thickness,length", [(2, 1, 11), (2, 1, 16), (3, 1, 10), (2, 2, 9), (3, 2, 8),
                                                    (4, 1, 17)])
def test_tree_spans_equal_the_states_a_token_change_reaches(chunk: int, thickness: int, length: int) -> None:
    """Row p+1 changes token p; kept state j of step l must change iff start[j] <= p <= end[j]."""
    model = _classifier(chunk, thickness)
    base = torch.randint(0, 3, (1, length), generator=torch.Generator().manual_seed(length))
    rows = base.repeat(length + 1, 1)  # (T+1, T): row 0 unchanged
    rows[torch.arange(1, length + 1), torch.arange(length)] = (base[0] + 1) % 3  # row p+1: token p changed
    states = tree_states(model, rows)
    spans = tree_spans(length, chunk, thickness)
    assert len(states) == len(spans) == model.stack.depth(length)
    assert (spans[-1].start.tolist(), spans[-1].end.tolist()) == ([0], [length - 1])
    for h, span in zip(states, spans):
        assert h.shape == (length + 1, len(span), 8)
        delta = (h[1:] - h[:1]).abs().amax(dim=-1)  # (T perturbed positions, n_l)
        assert bool(((delta > 1e-7) | (delta == 0)).all()), "a change must be either real or exactly nothing"
        pos = np.arange(length)[:, None]
        expected = (span.start[None, :] <= pos) & (pos <= span.end[None, :])  # (T, n_l)
        np.testing.assert_array_equal((delta > 0).numpy(), expected)


def test_tree_states_refuse_a_model_whose_forward_they_do_not_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _classifier(2, 1)
    tokens = torch.randint(0, 3, (2, 9))
    assert len(tree_states(model, tokens)) == 4
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda x: real(x) + 0.5)
    with pytest.raises(RuntimeError, match="no longer follows tree mode"):
        tree_states(model, tokens)


def test_k1_spans_hold_c_to_the_l_plus_1_tokens_clipped_at_zero() -> None:
    for step, span in enumerate(tree_spans(500, 2, 1)):
        np.testing.assert_array_equal(span.start, np.maximum(span.end - (2 ** (step + 1) - 1), 0))


@pytest.mark.parametrize("task", ["parity_check", "cycle_navigation"])
def test_span_transitions_equal_the_task_label_of_the_span(task: str) -> None:
    spec = make_task(task)
    tokens, _ = spec.sample(6, 37, torch.Generator().manual_seed(1))
    for span in tree_spans(37, 3, 2):
        got = span_transitions(task, tokens, span)  # (B, n)
        for j, (s, e) in enumerate(zip(span.start, span.end)):
            torch.testing.assert_close(got[:, j], spec.label(tokens[:, s:e + 1]), rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------- clustering


def test_pca_recovers_known_axes_and_variances() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(300, 3, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(a - a.mean(0))  # (300, 3) orthonormal, centred columns
    axes, _ = torch.linalg.qr(torch.randn(6, 3, generator=g, dtype=torch.float64))  # (6, 3) orthonormal
    x = (q * torch.tensor([10.0, 3.0, 1.0], dtype=torch.float64)) @ axes.T + 5.0  # (300, 6), shifted
    coords, ratio = pca(x)
    torch.testing.assert_close(ratio, torch.tensor([100.0, 9.0], dtype=torch.float64) / 110)
    torch.testing.assert_close(coords.abs(), (q[:, :2] * torch.tensor([10.0, 3.0], dtype=torch.float64)).abs())


def test_silhouette_and_purity_match_hand_computation() -> None:
    x = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=torch.float64)
    expected = (2 * 9.5 / 10.5 + 2 * 8.5 / 9.5) / 4  # a = 1 everywhere; b = 10.5, 9.5, 9.5, 10.5
    assert silhouette(x, torch.tensor([0, 0, 1, 1])) == pytest.approx(expected, abs=1e-12)
    singleton = torch.tensor([[0.0], [1.0], [5.0]], dtype=torch.float64)  # s = 0 for the singleton
    assert silhouette(singleton, torch.tensor([3, 3, 7])) == pytest.approx((0.8 + 0.75 + 0.0) / 3, abs=1e-12)
    assert purity(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 0, 1])) == (0.75, 0.75)
    assert purity(torch.tensor([5, 5, 2, 2, 9, 9]), torch.tensor([1, 1, 0, 0, 0, 0])) == (1.0, 4 / 6)


def _blobs(centres: Tensor, per: int, spread: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(len(centres)).repeat_interleave(per)
    return centres[labels] + spread * torch.randn(len(labels), centres.shape[1], generator=g, dtype=torch.float64), \
        labels


@pytest.mark.parametrize("k", [2, 3, 5])
def test_kmeans_and_silhouette_find_hand_made_clusters(k: int) -> None:
    angle = torch.arange(k, dtype=torch.float64) * 2 * torch.pi / k
    centres = torch.stack([angle.cos(), angle.sin(), torch.zeros(k, dtype=torch.float64)], 1) * 4  # a k-gon in 3-D
    x, labels = _blobs(centres, per=60, spread=0.3)
    assign, _ = kmeans(x, k)
    assert purity(assign, labels) == (1.0, 1.0)
    best, scores, assign = choose_k(x, k_max=8)
    assert best == k and set(scores) == set(range(2, 9))
    assert purity(assign, labels) == (1.0, 1.0)


def test_kmeans_survives_duplicate_points() -> None:
    x = torch.tensor([[0.0, 0.0]] * 5 + [[1.0, 1.0]] * 5, dtype=torch.float64)
    assign, inertia = kmeans(x, 3)
    assert inertia == 0.0 and purity(assign, torch.tensor([0] * 5 + [1] * 5))[0] == 1.0


# ------------------------------------------------------------------------------------------ input-gradient maps


class _WeightedSumLM(nn.Module):
    """logits_t = W · Σ_{s ≤ t} w_s e_s: so ∂ℓ/∂e_s at the last position = w_s Wᵀ(p − y), ‖·‖ ∝ |w_s|."""

    def __init__(self, weights: list[float], vocab: int = 7, d: int = 4, classifier: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.register_buffer("w", torch.tensor(weights))
        self.proj = nn.Linear(d, vocab)
        self.classifier = classifier

    def forward(self, tokens: Tensor) -> Tensor:
        h = (self.embed(tokens) * self.w[None, :, None]).cumsum(dim=1)  # (B, T, d)
        logits = self.proj(h)  # (B, T, V)
        return logits[:, -1] if self.classifier else logits


@pytest.mark.parametrize("classifier", [False, True])
def test_receptive_field_of_an_analytic_model(classifier: bool) -> None:
    weights = [0.0, 1.0, -2.0, 0.0, 3.0]  # positions 0 and 3 are invisible: exactly zero gradient
    model = _WeightedSumLM(weights, classifier=classifier)
    tokens = torch.randint(0, 7, (9, 5), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 7, (9,), generator=torch.Generator().manual_seed(1))
    norms = input_gradient_norms(model, tokens, targets)
    assert bool((norms[:, [0, 3]] == 0).all()) and bool((norms[:, [1, 2, 4]] > 0).all())
    rf = receptive_field(model, tokens, targets, batch_size=4)
    np.testing.assert_allclose(rf.normalised, [0, 1 / 6, 2 / 6, 0, 3 / 6], atol=1e-6)
    np.testing.assert_allclose(rf.cumulative, [1, 1, 5 / 6, 1 / 2, 1 / 2], atol=1e-6)
    assert (rf.reach(0.5), rf.reach(0.9), rf.sequences) == (1, 4, 9)
    assert all(p.grad is None for p in model.parameters()), "probing must not touch parameter gradients"


def test_input_gradient_norms_match_finite_differences_for_a_transformer_lm() -> None:
    cfg = ModelConfig(architecture="transformer", head="lm", vocab_size=11, d_model=8, n_heads=2, n_layers=2,
                      position="alibi", init_std=0.3)
    model = build_model(cfg).double().eval()
    tokens = torch.randint(0, 11, (1, 9), generator=torch.Generator().manual_seed(2))
    target = torch.tensor([4])
    norms = input_gradient_norms(model, tokens, target)  # (1, 9)

    def loss_with(position: int, delta: Tensor) -> float:
        handle = model.embed.register_forward_hook(lambda _m, _i, out: out + nn.functional.pad(
            delta[None, None], (0, 0, position, tokens.shape[1] - 1 - position)))
        with torch.no_grad():
            loss = nn.functional.cross_entropy(model(tokens)[:, -1], target)
        handle.remove()
        return float(loss)

    eps = 1e-6
    for position in (0, 4, 8):
        grad = torch.tensor([(loss_with(position, eps * e) - loss_with(position, -eps * e)) / (2 * eps)
                             for e in torch.eye(8, dtype=torch.float64)])
        assert float(norms[0, position]) == pytest.approx(float(grad.norm()), rel=1e-6)


def test_regular_gpt_receptive_field_is_normalised_and_covers_every_position() -> None:
    model = _classifier(2, 1)
    task = make_task("cycle_navigation")
    tokens, labels = task.sample(6, 21, torch.Generator().manual_seed(0))
    rf = receptive_field(model, tokens, labels.clamp_max(1), batch_size=4)
    assert rf.normalised.sum() == pytest.approx(1.0, abs=1e-12) and rf.cumulative[0] == pytest.approx(1.0)
    assert bool((np.diff(rf.cumulative) <= 1e-15).all()) and bool((rf.normalised > 0).all())
    lm = build_model(ModelConfig(architecture="regular_gpt", head="lm", vocab_size=5, d_model=8, n_heads=2,
                                 chunk_size=3, thickness=2)).double()
    norms = input_gradient_norms(lm, torch.randint(0, 5, (2, 11)), torch.tensor([0, 3]))
    assert bool((norms > 0).all()), "the last token of a full-depth RegularGPT sees every position"


def test_lm_batch_windows_come_from_the_split(tmp_path: Path) -> None:
    stream = np.arange(200) % 61
    folder = _write_data(tmp_path / "data", stream)
    cfg = Config(model=ModelConfig(vocab_size=61), data=DataConfig(path=str(folder)))
    inputs, targets = lm_batch(cfg, 16, 5, seed=3)
    assert inputs.shape == (5, 16) and targets.shape == (5,)
    start = inputs[:, 0]  # consecutive ids mod 61: the target follows the last input token
    torch.testing.assert_close(inputs, (start[:, None] + torch.arange(16)) % 61)
    torch.testing.assert_close(targets, (inputs[:, -1] + 1) % 61)
    random_inputs, _ = lm_batch(cfg, 16, 5, seed=3, random_tokens=True)
    assert random_inputs.shape == (5, 16) and int(random_inputs.max()) < 61


# ----------------------------------------------------------------------------------------------------------- CLIs


def _write_data(folder: Path, tokens: np.ndarray) -> Path:
    folder.mkdir(parents=True)
    tokenizer = b"fake sentencepiece model"
    (folder / "tokenizer.model").write_bytes(tokenizer)
    splits = {}
    for name in ("train", "val", "test"):
        tokens.astype(np.uint16).tofile(folder / f"{name}.bin")
        splits[name] = {"tokens": len(tokens), "documents": 1, "file": f"{name}.bin"}
    manifest = {"format_version": 1, "dtype": "uint16", "vocab_size": 61, "splits": splits,
                "tokenizer": {"file": "tokenizer.model", "sha256": hashlib.sha256(tokenizer).hexdigest()}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _brute_pad_chain(length: int, chunk: int) -> int:
    """Tree mode on explicit spans: left-pad to a multiple of C with None, merge each chunk into one span."""
    nodes: list[tuple[int, int] | None] = [(i, i) for i in range(length)]
    best = run = 0
    while True:
        nodes = [None] * (-len(nodes) % chunk) + nodes
        chunks = [nodes[i:i + chunk] for i in range(0, len(nodes), chunk)]
        real = [n for n in chunks[0] if n is not None]
        alone = len(real) == 1 and real[0][1] > real[0][0]  # a prefix of >= 2 symbols meets only pads
        run = run + 1 if alone else 0
        best = max(best, run)
        nodes = [(min(n[0] for n in c if n), max(n[1] for n in c if n)) for c in chunks]
        if len(nodes) == 1:
            return best


@pytest.mark.parametrize("chunk", [2, 3, 4])
def test_pad_chain_equals_a_brute_force_tree_of_spans(chunk: int) -> None:
    for length in range(1, 300):
        assert pad_chain(length, chunk) == _brute_pad_chain(length, chunk), (length, chunk)
    assert [pad_chain(t, 2) for t in (34, 258, 257, 512, 40)] == [4, 7, 0, 0, 2]  # the docstring's examples
    assert max(pad_chain(t, 2) for t in range(1, 41)) == 4  # the training lengths of every formal profile


def test_pad_chains_cli_groups_every_length_by_its_chain(tmp_path: Path) -> None:
    model_cfg = ModelConfig(architecture="regular_gpt", head="classifier", vocab_size=2, num_classes=2, d_model=16,
                            n_heads=2, chunk_size=2, norm="post", activation="relu")
    cfg = FormalConfig(model=model_cfg, data=FormalDataConfig(task="even_pairs", max_length=10))
    save_model_file(tmp_path / "run" / "model.pt", cfg, build_model(model_cfg))
    cli = load_script("eval/pad_chains.py")
    out = tmp_path / "chains.md"
    assert cli.main(["--runs", str(tmp_path / "run"), "--out", str(out), "--max-length", "40", "--samples", "8"]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    run = report["runs"][0]
    assert report["commit"] and report["command"] and len(run["per_length"]) == 40
    chains = {r["chain"]: r for r in run["chains"]}
    assert sum(r["train_lengths"] for r in run["chains"]) == 10 and sum(r["held_out_lengths"] for r in run["chains"]) == 30
    assert chains[4]["held_out_lengths"] == 1 and chains[4]["train_lengths"] == 0  # T = 34 alone
    want = np.mean([run["per_length"][str(t)] for t in range(11, 41) if pad_chain(t, 2) == 1])
    assert chains[1]["held_out_mean"] == pytest.approx(want)
    assert "| 4 | 0 |" in out.read_text()
    lm_cfg = Config(model=ModelConfig(architecture="regular_gpt", head="lm", vocab_size=5))
    save_model_file(tmp_path / "lm" / "model.pt", lm_cfg, build_model(lm_cfg.model))
    assert cli.main(["--runs", str(tmp_path / "lm"), "--out", str(out)]) == 2

def test_state_clusters_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_cfg = ModelConfig(architecture="regular_gpt", head="classifier", vocab_size=3, num_classes=5, d_model=16,
                            n_heads=2, chunk_size=2, norm="post", activation="relu")
    cfg = FormalConfig(model=model_cfg, data=FormalDataConfig(task="cycle_navigation"))
    save_model_file(tmp_path / "run" / "model.pt", cfg, build_model(model_cfg))
    cli = load_script("eval/state_clusters.py")
    out = tmp_path / "out"
    assert cli.main(["--run", str(tmp_path / "run"), "--out", str(out), "--length", "40", "--samples", "12",
                     "--k-max", "4"]) == 0
    summary = json.loads((out / "clusters.json").read_text())
    assert summary["task"] == "cycle_navigation" and summary["commit"] and summary["command"]
    assert [r["step"] for r in summary["steps"]] == [0, 1, 2, 3, 4, 5, -1]  # ceil(log2 40) = 6 steps + pooled
    assert [r["kept_positions"] for r in summary["steps"][:-1]] == [20, 10, 5, 3, 2, 1]
    assert all(set(r["silhouettes"]) == {"2", "3", "4"} for r in summary["steps"])
    assert (not HAS_MATPLOTLIB or (out / "clusters.png").stat().st_size > 0) and "| all |" in (out / "clusters.md").read_text()
    lm_cfg = Config(model=ModelConfig(architecture="regular_gpt", head="lm", vocab_size=5))
    save_model_file(tmp_path / "lm" / "model.pt", lm_cfg, build_model(lm_cfg.model))
    assert cli.main(["--run", str(tmp_path / "lm"), "--out", str(out)]) == 2
    assert "need a RegularGPT classifier" in capsys.readouterr().err


def test_receptive_field_cli_end_to_end_formal_and_lm(tmp_path: Path) -> None:
    cli = load_script("eval/receptive_field.py")
    formal = ModelConfig(architecture="regular_gpt", head="classifier", vocab_size=2, num_classes=2, d_model=16,
                         n_heads=2, norm="post", activation="relu")
    save_model_file(tmp_path / "formal" / "model.pt",
                    FormalConfig(model=formal, data=FormalDataConfig(task="parity_check")), build_model(formal))
    lm = ModelConfig(architecture="transformer", head="lm", vocab_size=61, d_model=16, n_heads=2, n_layers=1,
                     position="alibi")
    folder = _write_data(tmp_path / "data", np.random.default_rng(0).integers(0, 61, 300))
    save_model_file(tmp_path / "lm" / "model.pt", Config(model=lm, data=DataConfig(path=str(folder), seq_len=24)),
                    build_model(lm))
    for run, extra, length in (("formal", ["--length", "30"], 30), ("lm", [], 24),
                               ("lm", ["--random-tokens", "--length", "40"], 40)):
        out = tmp_path / f"out-{run}-{length}"
        assert cli.main(["--run", str(tmp_path / run), "--out", str(out), "--samples", "6", "--batch-size", "4",
                         *extra]) == 0
        rows = (out / "receptive_field.csv").read_text().splitlines()
        assert rows[0] == "position,distance,grad_norm,normalised,cumulative" and len(rows) == length + 1
        assert float(rows[1].split(",")[-1]) == pytest.approx(1.0, abs=1e-5)
        summary = json.loads((out / "receptive_field.json").read_text())
        assert summary["length"] == length and summary["sequences"] == 6
        assert not HAS_MATPLOTLIB or (out / "receptive_field.png").stat().st_size > 0


def test_state_clusters_of_an_identity_stack_are_the_kept_tokens() -> None:
    """Zero output projection and FFN output: every layer is the identity, so the state kept at position p is the
    embedding of token p. Then k-means finds exactly the 3 token embeddings (k* = 3, silhouette 1), and purity
    against the span transitions is a count written here: step l keeps p = 2^(l+1)·i + 2^(l+1) − 1, whose span
    is the 2^(l+1) tokens ending at p, labelled Σ(a − 1) mod 5 (cycle navigation)."""
    from collections import Counter

    from regulargpt.evaluation.state_clusters import cluster_depth_steps

    cfg = ModelConfig(architecture="regular_gpt", head="classifier", vocab_size=3, num_classes=5, d_model=16,
                      n_heads=2, chunk_size=2, thickness=1)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for sub in model.stack.sublayers:
            sub.layer.out.weight.zero_()
            sub.layer.ffn_out.weight.zero_()
            sub.layer.ffn_out.bias.zero_()
    tokens = torch.randint(0, 3, (12, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        steps = cluster_depth_steps(model, "cycle_navigation", tokens, k_max=5)
    for level in (0, 1):
        summary = steps[level][0]
        width = 2 ** (level + 1)
        kept = [(b, p) for b in range(12) for p in range(width - 1, 16, width)]
        assert summary.kept_positions == 16 // width and summary.distinct_states == 3
        assert summary.k_best == 3 and summary.silhouettes[3] == pytest.approx(1.0)
        pairs = Counter((int(tokens[b, p]), int((tokens[b, p - width + 1:p + 1] - 1).sum()) % 5) for b, p in kept)
        best_label = {t: max(n for (tok, _), n in pairs.items() if tok == t) for t in range(3)}
        best_token = {y: max(n for (_, lab), n in pairs.items() if lab == y) for y in {lab for _, lab in pairs}}
        assert summary.purity == pytest.approx(sum(best_label.values()) / len(kept))
        assert summary.inverse_purity == pytest.approx(sum(best_token.values()) / len(kept))
