"""The scale planner: parameter counts, ZeRO model states against DeepSpeed's estimators, activations against what
autograd saves, and the CLI's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, load_script

from regulargpt.cli import run
from regulargpt.config import ConfigError, load_config
from regulargpt.model import build_model
from regulargpt.model.sliding_dilated import fused_algorithm
from regulargpt.scale_plan import (
    Cluster,
    ModelSize,
    activation_bytes,
    choose_stage,
    longest_length,
    model_size,
    model_state_bytes,
    step_seconds,
    zero_buffers,
)

BASE, ALIBI = ROOT / "configs/base.json", ROOT / "configs/baselines/alibi.json"
SMALL = ["model.vocab_size=512", "model.d_model=64", "model.n_heads=4"]


@pytest.mark.parametrize("path", [BASE, ALIBI])
def test_parameter_count_equals_the_built_model(path: Path) -> None:
    cfg = load_config(path)
    model = build_model(cfg.model)
    size = model_size(cfg.model)
    assert size.params == sum(p.numel() for p in model.parameters())
    d, v, h, f = 768, 8000, 12, 4
    layer = 4 * d * d + 2 * f * d * d + f * d + 5 * d  # the closed form of model_size's docstring
    expected = v * d + (4 * (layer + h * 8) + d if path == BASE else 12 * layer) + 2 * d + d * v
    assert size.params == expected
    assert size.largest_layer == max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


def _deepspeed_estimates(params: int, largest: int, gpus: int, nodes: int) -> tuple[int, int]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _, z2 = estimate_zero2_model_states_mem_needs(params, gpus, nodes, cpu_offload=False)
    _, z3, _ = estimate_zero3_model_states_mem_needs(params, largest, gpus, nodes, cpu_offload=False,
                                                     cpu_offload_params=False)
    return z2, z3


@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (2, 1), (8, 1), (8, 4)])
def test_model_states_against_deepspeeds_estimators(gpus: int, nodes: int) -> None:
    """ZeRO-2 equals DeepSpeed's number to the byte (2P + 18P/N); ZeRO-3 is DeepSpeed's plus the sharded 16-bit
    weights 2P/N; ZeRO-1 keeps the whole 16-bit gradient, 2P − 2P/N more than ZeRO-2; ZeRO-0 = ZeRO-2 at N = 1.
    The sizes come from DeepSpeed's own counting of a built model (`_all_live` functions print the same numbers)."""
    from deepspeed.runtime.zero.stage3 import model_to_params as z3_params
    from deepspeed.runtime.zero.stage_1_and_2 import model_to_params

    model = build_model(load_config(BASE).model)
    params = model_to_params(model)
    total, largest = z3_params(model)
    assert (total, largest) == (params, model_size(load_config(BASE).model).largest_layer)
    size, n = ModelSize(params, largest), gpus * nodes
    z2, z3 = _deepspeed_estimates(params, largest, gpus, nodes)
    states = {s: sum(model_state_bytes(size, s, n, "bf16").values()) for s in (0, 1, 2, 3)}
    assert int(2 * params + int(18 * params / n)) == z2
    assert states[2] == pytest.approx(z2, abs=1)
    assert states[3] == pytest.approx(z3 + 2 * params / n, abs=1)
    assert states[1] - states[2] == pytest.approx(2 * params - 2 * params / n, abs=1)
    assert states[0] == pytest.approx(_deepspeed_estimates(params, largest, 1, 1)[0], abs=1)
    assert zero_buffers(size, 0, "bf16") == 0 and zero_buffers(size, 3, "bf16") == 4 * params  # P < both defaults


def test_fp32_zero0_is_plain_adamw() -> None:
    assert model_state_bytes(ModelSize(1000, 10), 0, 4, "fp32") == {"weights": 4000, "grads": 4000, "optimizer": 8000}


def _saved_bytes(cfg, length: int, batch: int) -> int:
    """Bytes autograd saves for one forward + loss, each storage once, parameters excluded (as in DeepSpeed bf16)."""
    model = build_model(cfg.model)
    if cfg.train.precision == "bf16":
        model = model.bfloat16()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    tokens = torch.randint(0, cfg.model.vocab_size, (batch, length + 1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    return sum(seen.values())


@pytest.mark.parametrize(("path", "precision", "length"), [
    (BASE, "bf16", 100), (BASE, "bf16", 256), (BASE, "fp32", 256), (ALIBI, "bf16", 100), (ALIBI, "fp32", 256),
    (ROOT / "configs/baselines/nope.json", "bf16", 256)])
def test_activations_match_what_autograd_saves(path: Path, precision: str, length: int) -> None:
    """Within 1 % of the saved-tensor bytes (the rest: index tensors and pad states of a few hundred bytes)."""
    cfg = load_config(path, [*SMALL, f"train.precision={precision}"])
    b = 2 if precision == "bf16" else 4
    transient = (b + 4 if b == 2 else 4) * 512 * 2 * length  # the loss's logits, not saved
    estimate = activation_bytes(cfg, length, 2, False, "cpu") - transient
    assert estimate == pytest.approx(_saved_bytes(cfg, length, 2), rel=0.01)


def test_activations_hand_computed_and_linear_at_fixed_depth() -> None:
    """RegularGPT d 64, H 4, C 8, K 4, V 512, bf16, B 1, T 256 (3 depth steps: dilations 1, 8, 64; the C++
    operator at each, or without it the blocked kernel at the first two and shift at the last, where N = 4). Per
    token: 12 applications × (LN in/stats, matmul inputs, FFN hidden: 2·(5·64 + 8·64) + 8 = 1672) + 12 C++ calls ×
    (qkv 3·64·2 + fp32 probabilities 4·4·8 = 512), or 8 blocked × (5·64·2 + 4·16·(4+2)) = 8 × 1024 + 4 shift ×
    (3·64·2 + 2·64·2·11/4 + 4·4·8) = 4 × 1216; plus the head (2·64·2 + 4 + 4·512) = 2308 and the loss (6·512)."""
    cfg = load_config(BASE, SMALL)
    attention = 12 * 512 if fused_algorithm("cpu") == "cpp" else 8 * 1024 + 4 * 1216
    per_token = 12 * 1672 + attention + 2308 + 6 * 512
    assert activation_bytes(cfg, 256, 1, False, "cpu") == per_token * 256
    cuda = (12 * 1672 + 8 * 1024 + 4 * 1216 + 2308 + 6 * 512) * 256  # CUDA runs the blocked/shift rule today
    assert activation_bytes(cfg, 256, 1, False, "cuda") == cuda
    # ALiBi on CUDA (FlexAttention: q, k, v views 3·64·2, out 64·2, fp32 lse 4·4 = 528): linear in T
    dense = [activation_bytes(load_config(ALIBI, SMALL), t, 1, False, "cuda") for t in (128, 256)]
    assert dense[1] == (12 * (1672 + 528) + 2308 + 6 * 512) * 256 == 2 * dense[0]
    cpu_dense = [activation_bytes(load_config(ALIBI, SMALL), t, 1, False, "cpu") for t in (128, 256)]
    assert cpu_dense[1] > 3 * cpu_dense[0]  # the query-chunked path's T² probabilities dominate
    with_ac = activation_bytes(cfg, 256, 1, True, "cpu")
    assert with_ac < activation_bytes(cfg, 256, 1, False, "cpu") / 2


def test_plan_base_on_the_kerple_cluster() -> None:
    """8 × 80 GB: the base config fits at ZeRO-0. At the same batch RegularGPT reaches a longer T than ALiBi's
    query-chunked CPU path (O(T²) probabilities), a shorter one than ALiBi's FlexAttention on CUDA (O(T), and 12
    layer applications against RegularGPT's 20 beyond T = 4,096)."""
    cluster = Cluster()
    stage, why = choose_stage(load_config(BASE), cluster)
    assert stage == 0 and "lowest stage that fits" in why
    regular, alibi = (longest_length(load_config(p), cluster, 0, False, batch=1, device="cpu") for p in (BASE, ALIBI))
    assert regular > 4 * alibi > 0
    regular, alibi = (longest_length(load_config(p), cluster, 0, False, batch=1) for p in (BASE, ALIBI))
    assert alibi > regular > 0
    assert step_seconds(load_config(BASE), cluster) > 0


def test_cluster_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^mfu: 1.5 is not allowed"):
        Cluster(mfu=1.5)
    with pytest.raises(ConfigError, match=r"^nodes: 0 is not allowed"):
        Cluster(nodes=0)


def test_cli_prints_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = load_script("eval/plan_scale.py")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"gpus_per_node": 4, "gpu_memory_gb": 40}))
    out = tmp_path / "plan.md"
    assert plan.main(["--config", str(BASE), "--cluster", str(cluster), "--mfu", "0.5", "--markdown", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 × 4 GPUs of 40 GB" in text and "MFU 0.5" in text and "Stage to choose" in text
    assert out.read_text() == text


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus-per-node", "0"], "error: --gpus-per-node: 0 is not allowed; expected an integer >= 1"),
    (["--mfu", "2"], "error: --mfu: 2.0 is not allowed; expected a fraction in (0, 1]"),
    (["--set", "model.architecture=transformer", "--set", "model.position=rope"],
     "error: model.position: 'rope' is not modelled by the planner"),
])
def test_cli_rejects_bad_input_in_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the entry points' wrapper (regulargpt.cli.run): one line on stderr, exit status 2."""
    plan = load_script("eval/plan_scale.py")
    with pytest.raises(SystemExit) as exit_info:
        run(lambda: plan.main(["--config", str(BASE), *args]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and len(err.splitlines()) == 1


def test_cli_rejects_unknown_cluster_key(tmp_path: Path) -> None:
    plan = load_script("eval/plan_scale.py")
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"gpus_per_nod": 8}))
    with pytest.raises(ConfigError, match=r"c.json.gpus_per_nod: unknown key; did you mean 'gpus_per_node'"):
        plan.main(["--config", str(BASE), "--cluster", str(cluster)])


def test_long_context_plan_by_hand_at_64k() -> None:
    """configs/long at T = 65,536, B 1, bf16, checkpointing, on CUDA (d 768, H 12, C 8, K 4, V 8000). Per token:
    each layer application keeps its input (2·768 = 1536) and one is recomputed at a time, the largest: common
    2·(5·768 + 8·768) + 8 = 19,976 plus, RegularGPT's last depth step (dilation 32,768, N = 2: shift) q 3·768·2 +
    pad-extended keys/values 2·768·2·9/2 + fp32 probabilities 4·12·8 = 18,816 (the blocked steps 8,832), ALiBi's
    FlexAttention 4·768·2 + 4·12 = 6,192; head 2·768·2 + 4 + 4·8000 = 35,076, loss 6·8000 = 48,000."""
    tail = 35_076 + 48_000
    regular = load_config(ROOT / "configs/long/regular_gpt_64k.json")
    alibi = load_config(ROOT / "configs/long/alibi_64k.json")
    assert activation_bytes(regular, device="cuda") == (24 * 1536 + 19_976 + 18_816 + tail) * 65536
    assert activation_bytes(alibi, device="cuda") == (12 * 1536 + 19_976 + 6_192 + tail) * 65536
    train = load_config(ROOT / "configs/long/regular_gpt_train_64k.json")  # 3 steps: dilations 1, 8, 64 (blocked)
    assert activation_bytes(train, device="cuda") == (12 * 1536 + 19_976 + 8_832 + tail) * 65536
