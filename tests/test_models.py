"""Every model: causality, overfitting one batch, tree = sliding, bounded dense attention, clear errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from regulargpt.config import ConfigError, ModelConfig
from regulargpt.model import build_model, causal_attention, reference_sliding_dilated_attention

POSITIONS = ["none", "sinusoidal", "learned", "rope", "alibi", "t5", "kerple_log", "kerple_power", "xl_relative",
             "fire", "xpos", "sandwich"]
LM_KINDS = [("regular_gpt", "none", {})] + [("transformer", p, {}) for p in POSITIONS] + [
    ("regular_gpt", "none", {"pad": "mask", "chunk_size": 3, "norm": "post", "activation": "relu"})
]


def _cfg(arch: str, position: str = "none", **kw) -> ModelConfig:
    base = dict(architecture=arch, position=position, vocab_size=17, d_model=32, n_heads=4, n_layers=2,
                thickness=2, max_positions=64)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("arch,position,extra", LM_KINDS, ids=[f"{a}-{p}-{len(e)}" for a, p, e in LM_KINDS])
def test_causality_changing_token_t_never_changes_earlier_logits(arch, position, extra):
    model = build_model(_cfg(arch, position, **extra)).double().eval()
    x = torch.randint(0, 17, (2, 40))
    base = model(x)
    for t in (0, 7, 21, 39):
        x2 = x.clone()
        x2[:, t] = (x2[:, t] + 1) % 17
        out = model(x2)
        assert torch.allclose(out[:, :t], base[:, :t], atol=1e-12), (arch, position, t)
        assert not torch.allclose(out[:, t], base[:, t]), "the changed token must matter at its own position"


def _overfit(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lm: bool, steps: int = 150) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, -2), y.flatten()) if lm else F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("arch,position,extra", LM_KINDS, ids=[f"{a}-{p}-{len(e)}" for a, p, e in LM_KINDS])
def test_two_layer_lm_overfits_one_batch(arch, position, extra):
    model = build_model(_cfg(arch, position, **extra))
    tokens = torch.randint(0, 17, (4, 17))
    loss = _overfit(model, tokens[:, :-1], tokens[:, 1:], lm=True)
    assert loss < 0.3, f"{arch}/{position}: loss {loss:.3f} after 150 steps on one batch"


CLASSIFIERS = [
    ("regular_gpt", dict(norm="post", activation="relu", embedding_scale=True)),
    ("transformer", dict(position="xl_relative", norm="post", activation="relu", embedding_scale=True)),
    ("transformer", dict(position="alibi")),
    ("rnn", dict(d_model=64, n_layers=1)),
    ("lstm", dict(d_model=32, n_layers=2)),
]
SLOW_TO_OVERFIT = {"regular_gpt-", "transformer-xl_relative"}  # about 6 s each: left to the full suite


@pytest.mark.parametrize("arch,extra", [
    pytest.param(a, e, id=f"{a}-{e.get('position', '')}",
                 marks=[pytest.mark.slow] if f"{a}-{e.get('position', '')}" in SLOW_TO_OVERFIT else [])
    for a, e in CLASSIFIERS])
def test_two_layer_classifier_overfits_one_batch(arch, extra):
    model = build_model(_cfg(arch, head="classifier", num_classes=3, **extra))
    x = torch.randint(0, 17, (16, 13))
    y = torch.randint(0, 3, (16,))
    assert _overfit(model, x, y, lm=False, steps=200) < 0.1, arch


@pytest.mark.parametrize("arch,extra", CLASSIFIERS, ids=[f"{a}-{e.get('position', '')}" for a, e in CLASSIFIERS])
def test_classifier_output_depends_on_every_token(arch, extra):
    model = build_model(_cfg(arch, head="classifier", num_classes=3, **extra)).double().eval()
    x = torch.randint(0, 17, (1, 20))
    base = model(x)
    for t in range(20):
        x2 = x.clone()
        x2[0, t] = (x2[0, t] + 1) % 17
        assert (model(x2) - base).abs().max() > 0, (arch, t)  # fp64: far tokens matter little at init, never zero


def test_xl_relative_attention_matches_brute_force():
    import math as _m

    from regulargpt.model.xl_relative import XLRelativeAttention

    att = XLRelativeAttention(d_model=12, n_heads=3).double()
    q, k, v = (torch.randn(2, 3, 9, 4, dtype=torch.float64) for _ in range(3))
    out = att(q, k, v, memory_mb=1)
    freqs = [10000.0 ** (-2.0 * i / 12) for i in range(6)]
    sinus = torch.tensor([[_m.sin(d * f) for f in freqs] + [_m.cos(d * f) for f in freqs] for d in range(9)],
                         dtype=torch.float64)
    rel = att.proj(sinus).view(9, 3, 4)  # (Δ, H, Dh)
    for m in (0, 4, 8):
        logits = torch.stack([((q[:, :, m] + att.u) * k[:, :, n]).sum(-1) + ((q[:, :, m] + att.v) * rel[m - n]).sum(-1)
                              for n in range(m + 1)], dim=-1) / 2.0  # sqrt(Dh) = 2
        want = torch.einsum("bhn,bhnd->bhd", logits.softmax(-1), v[:, :, : m + 1])
        assert torch.allclose(out[:, :, m], want, atol=1e-12), m


# ---------------------------------------------------------------------------- tree mode vs sliding mode


def _reference_tree(stack, x: torch.Tensor, steps: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The authors' tree formulation written out independently: left-pad with the learned pad to a multiple of C,
    run the K sub-layers with the dense reference kernel (dilation 1, keys before index 0 read the pad state),
    keep the last of each chunk. `steps` collects the kept states (B, n, d) of every step."""
    c = stack.chunk_size
    t = x.shape[1]
    while True:
        pad = stack.pad
        left = -t % c
        if pad is not None and left:
            x = torch.cat([pad.view(1, 1, -1).expand(x.shape[0], left, -1), x], dim=1)
        for sub in stack.sublayers:
            if pad is None:
                attend = lambda q, k, v, sub=sub: reference_sliding_dilated_attention(q, k, v, sub.rel_bias, 1)
            else:
                pk, pv = sub.layer.key_value(pad.view(1, 1, -1))
                pk, pv = pk[:, :, 0].expand(x.shape[0], -1, -1), pv[:, :, 0].expand(x.shape[0], -1, -1)
                attend = lambda q, k, v, sub=sub, pk=pk, pv=pv: reference_sliding_dilated_attention(
                    q, k, v, sub.rel_bias, 1, pk, pv)
            x_new = sub.layer(x, attend)
            pad = None if pad is None else sub.layer(pad.view(1, 1, -1), lambda q, k, v: v).view(-1)
            x = x_new
        x = x[:, (x.shape[1] - 1) % c:: c]
        if steps is not None:
            steps.append(x)
        t = x.shape[1]
        if t == 1:
            return x[:, 0]


@pytest.mark.parametrize("c", [2, 3, 4])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("pad", ["learned", "mask"])
def test_tree_mode_equals_sliding_mode_at_last_position(c, k, pad):
    cfg = _cfg("regular_gpt", head="classifier", num_classes=2, chunk_size=c, thickness=k, pad=pad, norm="post",
               activation="relu", embedding_scale=True)
    model = build_model(cfg).double()
    for t in list(range(1, 20)) + [c**3, c**3 + 1, 70]:
        emb = model.embed(torch.randint(0, 17, (3, t)))
        sliding = model.stack.sliding(emb)[:, -1]
        tree = model.stack.tree(emb)
        assert torch.allclose(sliding, tree, atol=1e-5), (c, k, pad, t)
        if pad == "learned" or k == 1:
            assert torch.allclose(tree, _reference_tree(model.stack, emb), atol=1e-10), (c, k, pad, t)


@pytest.mark.parametrize("k", [1, 2])
def test_tree_steps_yield_the_kept_states_of_every_step(k):
    """stack.tree_steps (the one tree-mode loop; probes use it too) against the written-out reference, step by
    step, on its K = 1 kept-positions-only path and on its every-position path."""
    model = build_model(_cfg("regular_gpt", head="classifier", num_classes=2, chunk_size=3, thickness=k)).double()
    for t in (1, 3, 5, 9, 10, 28):
        emb = model.embed(torch.randint(0, 17, (2, t)))
        expected: list[torch.Tensor] = []
        _reference_tree(model.stack, emb, expected)
        fast = list(model.stack.tree_steps(emb))
        full = list(model.stack.tree_steps(emb, every_position=True))
        assert len(fast) == len(full) == len(expected) == next(n for n in range(1, 9) if 3**n >= t), t
        for a, b, e in zip(fast, full, expected):
            assert a.shape == b.shape == e.shape and torch.allclose(a, e, atol=1e-10) and torch.allclose(b, e,
                                                                                                         atol=1e-10)


def _loss_and_grads(model, logits_fn, tokens, labels):
    model.zero_grad()
    logits = logits_fn()
    F.cross_entropy(logits, labels).backward()
    return [logits.detach()] + [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("c,pad,norm", [(2, "learned", "post"), (2, "mask", "pre"), (3, "learned", "pre"),
                                        (3, "mask", "post"), (4, "learned", "post")])
@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_memoized_tree_has_the_loss_and_gradients_of_the_every_sequence_tree(c, pad, norm, kernel, monkeypatch):
    """The classifier's forward (each distinct chunk computed once) against forward_every_sequence (every sequence
    computed), logits and every parameter's gradient, fp64: vocabulary 2 (few distinct chunks, the
    memoised steps run to the end) and 17 (the per-position fallback takes over after a step or two); batch 4
    with fewer tokens than the vocabulary embeds only the distinct ones."""
    if kernel == "torch":  # chunk_attention's PyTorch path, as on a machine where the C++ operator does not build
        monkeypatch.setattr("regulargpt.model.regular_gpt.fused_algorithm", lambda device: None)
    for vocab, batch, lengths in [(2, 24, (1, 2, c + 1, 10, c**3, c**3 + 1, 41)),
                                  (17, 24, (1, 2, c + 1, 10, c**3, c**3 + 1, 41)), (17, 4, (1, 2, 3))]:
        cfg = _cfg("regular_gpt", head="classifier", num_classes=3, vocab_size=vocab, chunk_size=c, thickness=1,
                   pad=pad, norm=norm)
        model = build_model(cfg).double()
        for t in lengths:
            tokens, labels = torch.randint(0, vocab, (batch, t)), torch.randint(0, 3, (batch,))
            memo = _loss_and_grads(model, lambda: model(tokens), tokens, labels)
            full = _loss_and_grads(model, lambda: model.forward_every_sequence(tokens), tokens, labels)
            for a, b in zip(memo, full):
                assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), (vocab, t)


def test_memoized_tree_computes_fewer_rows_and_is_skipped_under_dropout():
    """Parity-sized input (vocabulary 2, C = 2, T = 40, batch 64): the memoised forward passes far fewer rows
    through the FFN than the per-position tree (whose step 0 alone has 64 · 20 = 1,280); with dropout in training
    the forward is the per-position tree, draw for draw."""
    cfg = _cfg("regular_gpt", head="classifier", num_classes=2, vocab_size=2, chunk_size=2, thickness=1)
    model = build_model(cfg)
    rows: list[int] = []
    hook = model.stack.sublayers[0].layer.ffn_in.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[:-1].numel()))
    tokens = torch.randint(0, 2, (64, 40))
    model(tokens)
    memo_rows, rows[:] = sum(rows), []
    model.forward_every_sequence(tokens)
    assert sum(rows) == 1 + 64 * (20 + 10 + 5 + 3 + 2 + 1) and memo_rows < sum(rows) / 3, (memo_rows, sum(rows))
    hook.remove()
    dropped = build_model(_cfg("regular_gpt", head="classifier", num_classes=2, vocab_size=2, chunk_size=2,
                               thickness=1, dropout=0.3))
    torch.manual_seed(1)
    out = dropped(tokens)
    torch.manual_seed(1)
    assert torch.equal(out, dropped.forward_every_sequence(tokens))


@pytest.mark.parametrize("base,width,rows", [(3, 2, 50), (40, 3, 200), (2**40, 2, 30), (7, 5, 2000)])
def test_distinct_rows_against_a_set(base, width, rows):
    """Counted keys (small range), sorted keys (large range) and the compaction that keeps a 40-bit base from
    overflowing int64: distinct rows in key order and rows == distinct[inverse]."""
    from regulargpt.model.tree_memo import distinct_rows
    g = torch.Generator().manual_seed(base % 1000 + width)
    values = torch.randint(0, min(base, 5), (rows, width), generator=g) * (base // min(base, 5))
    distinct, inverse = distinct_rows(values, base)
    assert sorted(map(tuple, distinct.tolist())) == sorted(set(map(tuple, values.tolist())))
    assert distinct.tolist() == sorted(distinct.tolist()) and torch.equal(distinct[inverse], values)


def test_adaptive_depth_follows_the_input_length():
    model = build_model(_cfg("regular_gpt", chunk_size=2, thickness=1))
    calls = []
    hook = model.stack.sublayers[0].register_forward_hook(lambda m, i, o: calls.append(i[0].shape[1]))
    for t, depth in [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (40, 6), (64, 6), (65, 7)]:
        calls.clear()
        model(torch.zeros(1, t, dtype=torch.long))
        assert len(calls) == depth, (t, calls)
    hook.remove()


def test_pad_state_passes_through_earlier_sublayers():
    """With K=2, the second sub-layer's pad equals sub-layer 1 applied to p as a length-1 sequence: checked by
    running sub-layer 1 on a sequence made only of pads (every key it sees is a pad)."""
    model = build_model(_cfg("regular_gpt", thickness=2)).double()
    stack = model.stack
    pads = stack.pad.view(1, 1, -1).expand(1, 5, -1)
    first = stack.sublayers[0]
    kv, next_pad = first.pad_step(stack.pad)
    out = first(pads, kv, dilation=1)
    assert torch.allclose(out, next_pad.view(1, 1, -1).expand_as(out), atol=1e-12)
    assert torch.equal(stack.pad_states()[1][0], stack.sublayers[1].pad_step(next_pad)[0][0])


# ---------------------------------------------------------------------------- dense baselines


def test_dense_attention_query_chunking_is_exact():
    q, k, v = (torch.randn(2, 3, 300, 8, dtype=torch.float64) for _ in range(3))
    model = build_model(_cfg("transformer", "alibi", n_heads=3, d_model=24))
    full = causal_attention(q, k, v, model.bias, memory_mb=1024)
    tiny = causal_attention(q, k, v, model.bias, memory_mb=1)  # forces chunks of a few rows
    assert torch.allclose(full, tiny, atol=1e-12)
    # brute force for one row
    m = 123
    logits = torch.einsum("bhd,bhnd->bhn", q[:, :, m], k[:, :, : m + 1]) / math.sqrt(8)
    logits = logits + model.bias(torch.tensor([m]), torch.arange(m + 1)).double()[:, 0]
    want = torch.einsum("bhn,bhnd->bhd", logits.softmax(-1), v[:, :, : m + 1])
    assert torch.allclose(full[:, :, m], want, atol=1e-12)


def test_dense_attention_chunk_memory_is_bounded():
    from regulargpt.model.dense_attention import query_chunk_size

    chunk = query_chunk_size(batch=1, heads=12, length=16384, memory_mb=256)
    assert 3 * 4 * 12 * chunk * 16384 <= 256 << 20
    assert chunk < 16384  # a full T×T block would not fit in the budget


def test_learned_positions_error_past_maximum():
    model = build_model(_cfg("transformer", "learned", max_positions=16))
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="max_positions=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_parameter_count_and_flops_are_reported():
    rg = build_model(_cfg("regular_gpt", thickness=1))
    tf = build_model(_cfg("transformer", "alibi", n_layers=1))
    # (the parameter count against a hand formula: tests/test_regular_gpt_truth.py)
    # one shared layer: the LM's weights don't grow with depth, its FLOPs do (log_C T layer applications)
    assert rg.flops_per_token(1024) > rg.flops_per_token(64)
    # dense attention FLOPs grow linearly in T, RegularGPT's only through the depth
    assert tf.flops_per_token(4096) - tf.flops_per_token(2048) > 0
    assert rg.flops_per_token(4096) - rg.flops_per_token(2048) == rg.flops_per_token(2048) - rg.flops_per_token(1024)


def test_impossible_model_combinations_are_config_errors():
    with pytest.raises(ConfigError, match="head"):
        build_model(_cfg("rnn", head="lm"))
    with pytest.raises(ConfigError, match="chunk_size"):
        build_model(_cfg("regular_gpt", chunk_size=1))
    with pytest.raises(ConfigError, match="position"):
        build_model(_cfg("lstm", "alibi", head="classifier", num_classes=2))


@pytest.mark.parametrize("position", ["xl_relative", "alibi", "t5", "kerple_log", "kerple_power", "rope", "none",
                                      "sinusoidal", "learned"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_transformer_classifier_computes_only_the_last_row_of_its_last_layer(position: str, norm: str) -> None:
    """The classifier's last layer runs one query row; its output equals the last row of the full encoder (fp64)."""
    from regulargpt.model import TransformerClassifier

    cfg = ModelConfig(architecture="transformer", head="classifier", num_classes=3, vocab_size=7, d_model=16,
                      n_heads=2, n_layers=3, position=position, max_positions=64, norm=norm)
    torch.manual_seed(0)
    model = TransformerClassifier(cfg).double().eval()
    tokens = torch.randint(0, 7, (3, 23))
    full = model.head(model.encode(tokens)[:, -1])
    torch.testing.assert_close(model(tokens), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tq", [1, 5, 17])
def test_causal_attention_for_the_last_query_rows(tq: int) -> None:
    from regulargpt.model import AlibiBias, causal_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 17, 8, dtype=torch.float64) for _ in range(3))
    for bias in (None, AlibiBias(4)):
        full = causal_attention(q, k, v, bias)
        torch.testing.assert_close(causal_attention(q[:, :, -tq:], k, v, bias, memory_mb=1), full[:, :, -tq:])


@pytest.mark.parametrize("position", ["xl_relative", "alibi", "t5", "kerple_log", "kerple_power", "rope", "none",
                                      "sinusoidal", "learned"])
def test_transformer_classifier_cannot_count_a_constant_string_unless_positions_enter_the_values(position: str) -> None:
    """On a string of one repeated token every causal attention row averages identical values, so with positions only
    in the scores (relative biases, RoPE, none) each layer's output is the same at every position and every length:
    "a"^n gets one answer for every n (why the Transformer column scores 0.500 on (aa)* and misses only 0^n, n >= 3, on
    Tomita 4; docs/FORMAL.md). Absolute positions added to the embeddings break the symmetry, and so do RegularGPT's
    learned pads (their count depends on n)."""
    from regulargpt.model import TransformerClassifier

    cfg = ModelConfig(architecture="transformer", head="classifier", num_classes=2, vocab_size=3, d_model=16,
                      n_heads=2, n_layers=3, position=position, max_positions=64)
    torch.manual_seed(0)
    model = TransformerClassifier(cfg).double().eval()
    with torch.no_grad():
        logits = torch.cat([model(torch.full((1, n), 1)) for n in range(1, 41)])  # (40, 2): lengths 1..40
    spread = (logits - logits[0]).abs().max().item()
    if position in ("sinusoidal", "learned"):
        assert spread > 1e-3
    else:
        assert spread < 1e-9


@pytest.mark.parametrize("pad", ["learned", "mask"])
def test_regular_gpt_learned_pads_tell_constant_strings_of_different_lengths_apart(pad: str) -> None:
    """Learned pads: 1^n gets a different answer for every n in 1..8. Masked pads: only the adaptive depth
    ceil(log2 n) differs, so n = 5..8 (depth 3) get one answer: the pads carry the count."""
    model = build_model(_cfg("regular_gpt", head="classifier", num_classes=2, vocab_size=3, chunk_size=2,
                             thickness=1, pad=pad)).double().eval()
    with torch.no_grad():
        logits = torch.cat([model(torch.full((1, n), 1)) for n in range(1, 9)])  # (8, 2): lengths 1..8
    distinct = torch.cdist(logits, logits).masked_fill(torch.eye(8, dtype=torch.bool), 1.0).min().item() > 1e-6
    assert distinct == (pad == "learned")
    if pad == "mask":
        assert (logits[4:] - logits[4]).abs().max().item() < 1e-9
