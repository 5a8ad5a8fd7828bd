"""Scale planning on paper: per-rank memory under ZeRO 0–3 and step time at a stated MFU, for a config and a cluster.

Everything is counted in bytes per rank for one optimizer step; N = nodes × GPUs per node ranks, P parameters, b
bytes per element of the working precision (bf16/fp16: 2, fp32: 4), B micro-batch sequences of T tokens.

**Model states** (Adam in mixed precision: the ZeRO paper's accounting, as DeepSpeed implements it)::

    stage  weights (b)   grads (b)     fp32 grads + master + Adam m, v  (4 + 4 + 4 + 4 = 16 bytes)
      0    b·P           b·P           16·P
      1    b·P           b·P           16·P / N
      2    b·P           b·P / N       16·P / N
      3    b·P / N       b·P / N       16·P / N        + 2·b·P_layer  (the largest layer gathered: weights + grads)

so bf16 ZeRO-2 is 2P + 18P/N, exactly DeepSpeed's ``estimate_zero2_model_states_mem_needs`` (no offload), and
bf16 ZeRO-3 is 20P/N + 4·P_layer, DeepSpeed's ``estimate_zero3_model_states_mem_needs`` plus 2P/N (DeepSpeed's
18 leaves out the sharded 16-bit weights). fp32 training at ZeRO 0 is plain AdamW, 4P + 4P + 8P (no master copy,
no second gradient); at ZeRO ≥ 1 DeepSpeed still keeps its fp32 partition (a copy) and its fp32 gradient partition.
Worked example, the base config (P = 40,629,888, bf16) on 2 ranks at ZeRO 1: 2P + 2P + 16P/2 = 12P = 487 MB.

**DeepSpeed buffers** (:func:`zero_buffers`): ZeRO 1–3 reduce gradients through flattened buckets of
``reduce_bucket_size`` (default 5e8 elements), a copy of b·min(P, bucket) bytes; ZeRO-3 gathers up to
``stage3_max_live_parameters`` (default 1e9) 16-bit weights. Below 5e8 parameters both are the whole model.

**Activations** (:func:`activation_bytes`): what autograd saves, counted from the model code (and checked against
``torch.autograd.graph.saved_tensors_hooks`` in tests/test_scale_plan.py). Per token and layer application, with f
the FFN multiple: the two LayerNorm inputs and their mean/rstd, the inputs of the qkv, output and FFN-in matmuls,
the FFN hidden before and after the activation: b·(2d + 3d + 2f·d) + 4b (two LayerNorms' mean and rstd, in b);
plus attention:

* RegularGPT ``shift`` (CPU, small C): q (as the qkv output, 3d), the pad-extended keys and values
  2d·(N+C−1)/N, fp32 probabilities 4·H·C;
* RegularGPT ``blocked`` (CPU, larger C): q d, keys and values of two blocks 4d, probabilities H·2C in fp32 and b;
* RegularGPT ``cpp`` (the C++ CPU operator): q, k, v as views of the qkv output 3d, fp32 probabilities 4·H·C;
  ``triton`` (the CUDA kernel, where `choose_algorithm` picks it): the same views and an fp32 log-sum-exp 4·H.
  The attention of each depth step is the algorithm `choose_algorithm` picks on the planned device (CUDA today:
  the shift/blocked rule, blocked at C = 8 in bf16 until the folded length N <= 4);
* dense with a bias (ALiBi) on CUDA: FlexAttention (dense_attention.attention_backend) saves q, k, v (views of the
  qkv output, 3d), its output d and the fp32 log-sum-exp 4H: 4d·b + 4H per token, O(T) (from the kernel's contract);
* dense with a bias (ALiBi) on CPU: the qkv output 3d, and per head the fp32 and b probabilities of every query chunk
  against its visible keys: Σ_chunks c·end ≈ T²/2 per sequence — O(T²) stored for training whatever the chunking
  (chunking bounds only the transient score block). In fp32 a fixed bias runs SDPA's flash kernel instead, which
  saves q, k, v and its log-sum-exp per layer (its output is the output projection's input) and, once per pass, the masked fp32 bias blocks the layers
  share (H·Σ_chunks c·end·4 bytes: still O(T²), but once, not per layer);
* dense without a bias (NoPE, sinusoidal: ``scaled_dot_product_attention``): qkv 3d and the fp32 log-sum-exp.

RegularGPT's depth is L = ceil(log_C T), so at a fixed depth its activations are linear in T: O(T·C) attention
memory per step. With activation checkpointing every layer application keeps only its input (b·d per token) and
one application is recomputed at a time. The head keeps the final LayerNorm input, the head's input and the fp32
log-softmax (4V per token); the loss briefly holds the logits in b and in fp32 besides ((b + 4)·V per token).

**Step time**: the step's FLOPs (:func:`regulargpt.step_flops.step_flops`: 3 × the forward, plus the layers'
forward once more with checkpointing) × micro-batches per rank ÷ (peak FLOP/s × MFU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from regulargpt.config import Config, ConfigError, ModelConfig
from regulargpt.model import adaptive_depth, build_model
from regulargpt.model.dense_attention import query_chunk_size
from regulargpt.model.sliding_dilated import choose_algorithm
from regulargpt.step_flops import step_flops

__all__ = ["Cluster", "ModelSize", "MemoryEstimate", "model_size", "precision_bytes", "model_state_bytes",
           "zero_buffers", "activation_bytes", "estimate", "step_seconds", "longest_length", "choose_stage",
           "GIB", "DEFAULT_BUCKET", "DEFAULT_MAX_LIVE"]

GIB = 2**30
DEFAULT_BUCKET = int(5e8)  # DeepSpeed's reduce_bucket_size default (elements)
DEFAULT_MAX_LIVE = int(1e9)  # DeepSpeed's stage3_max_live_parameters default (elements)


@dataclass(frozen=True)
class Cluster:
    """Where the run goes. `peak_tflops` is one GPU's dense matmul peak in the training precision; `mfu` the fraction
    of it the run is assumed to reach; `reserve_gb` memory per GPU kept back (CUDA context, allocator slack)."""

    gpus_per_node: int = 8
    gpu_memory_gb: float = 80.0
    nodes: int = 1
    peak_tflops: float = 312.0  # A100 80 GB, bf16 dense (NVIDIA's datasheet)
    mfu: float = 0.35
    reserve_gb: float = 0.0

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "nodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}: {value!r} is not allowed; expected an integer >= 1")
        for name in ("gpu_memory_gb", "peak_tflops"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not allowed; expected a number > 0")
        if not 0 < self.mfu <= 1:
            raise ConfigError(f"mfu: {self.mfu!r} is not allowed; expected a fraction in (0, 1]")
        if not 0 <= self.reserve_gb < self.gpu_memory_gb:
            raise ConfigError(f"reserve_gb: {self.reserve_gb!r} is not allowed; expected 0 <= reserve_gb < "
                              f"gpu_memory_gb={self.gpu_memory_gb}")

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_bytes(self) -> float:
        return (self.gpu_memory_gb - self.reserve_gb) * 1e9


@dataclass(frozen=True)
class ModelSize:
    """P (unique parameters) and DeepSpeed's largest layer (most parameters held directly by one module)."""

    params: int
    largest_layer: int


def model_size(cfg: ModelConfig) -> ModelSize:
    """Counted from the model built on the meta device (no memory, exact for every architecture).

    Closed form for the LM heads (h = ffn_mult·d; no qkv bias, untied, pre-LN): one layer has
    4d² + 2hd + h + 5d weights; RegularGPT = V·d + K·(layer + H·C) + d (pad) + 2d + d·V; a dense baseline =
    V·d + n_layers·layer + 2d + d·V. Base config (V 8000, d 768, H 12, C 8, K 4): 40,629,888.
    """
    with torch.device("meta"):
        model = build_model(cfg)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return ModelSize(params, largest)


def precision_bytes(precision: str) -> int:
    """Bytes per element of the working precision: bf16/fp16 2, fp32 4."""
    return 4 if precision == "fp32" else 2


def model_state_bytes(size: ModelSize, stage: int, ranks: int, precision: str) -> dict[str, float]:
    """{"weights", "grads", "optimizer"} bytes per rank (see the module docstring's table)."""
    p, n, b = size.params, ranks, precision_bytes(precision)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero stage must be 0, 1, 2 or 3, got {stage}")
    if precision == "fp32" and stage == 0:
        return {"weights": 4.0 * p, "grads": 4.0 * p, "optimizer": 8.0 * p}
    weights = b * p / n + 2 * b * size.largest_layer if stage == 3 else float(b * p)
    grads = b * p / n if stage >= 2 else float(b * p)
    optimizer = 16.0 * p / (n if stage >= 1 else 1)
    return {"weights": weights, "grads": grads, "optimizer": optimizer}


def zero_buffers(size: ModelSize, stage: int, precision: str, bucket: int = DEFAULT_BUCKET,
                 max_live: int = DEFAULT_MAX_LIVE) -> float:
    """DeepSpeed's buffers beyond :func:`model_state_bytes`: at ZeRO 1–3 gradients are reduced through a flattened
    bucket of up to min(P, reduce_bucket_size) elements in the working precision (``flatten`` copies them;
    deepspeed/runtime/zero/stage_1_and_2.py ``allreduce_bucket``); ZeRO-3 also gathers up to
    min(P, stage3_max_live_parameters) 16-bit weights. ZeRO-0 reduces the gradients in place."""
    b = precision_bytes(precision)
    if stage == 0:
        return 0.0
    extra = b * min(size.params, bucket)
    if stage == 3:
        extra += b * min(size.params, max_live)
    return float(extra)


def _dense_score_elements(batch: int, cfg: ModelConfig, length: int) -> int:
    """Σ over query chunks of chunk·visible keys: the score rows one head saves for a sequence (causal_attention)."""
    chunk = query_chunk_size(batch, cfg.n_heads, length, cfg.attention_memory_mb)
    return sum((min(length, s + chunk) - s) * min(length, s + chunk) for s in range(0, length, chunk))


def _attention_bytes(cfg: ModelConfig, length: int, batch: int, b: int, device: str) -> list[float]:
    """Saved attention bytes of each layer application for one micro-batch (B sequences of `length`)."""
    d, h, tokens = cfg.d_model, cfg.n_heads, batch * length
    probs = 4 + (b if b != 4 else 0)  # fp32 softmax output, and its cast to the working precision
    if cfg.architecture == "transformer":
        if cfg.position in ("alibi",) and device == "cuda":  # FlexAttention: q, k, v (qkv views), out, lse
            return [float((4 * d * b + 4 * h) * tokens)] * cfg.n_layers
        if cfg.position in ("alibi",):
            rows = _dense_score_elements(batch, cfg, length)
            if b >= 4:  # fp32: SDPA's flash kernel with the shared fp32 bias blocks as its mask (saved once)
                per_layer = (3 * d * b + 4 * h) * tokens  # qkv and the log-sum-exp (the output is the out-proj input)
                shared = h * rows * 4
                return [float(per_layer + shared)] + [float(per_layer)] * (cfg.n_layers - 1)
            per_layer = 3 * d * b * tokens + batch * rows * h * probs  # bf16: the explicit path's probabilities
        else:  # scaled_dot_product_attention: q, k, v (one qkv tensor) and the fp32 log-sum-exp
            per_layer = (3 * d * b + 4 * h) * tokens
        return [float(per_layer)] * cfg.n_layers
    c, out = cfg.chunk_size, []
    dtype = torch.float32 if b == 4 else torch.bfloat16
    train_depth = cfg.depth_policy == "train" and cfg.train_length  # ceil(log_C T_train) steps at every T
    for level in range(adaptive_depth(cfg.train_length if train_depth else length, c)):
        dil = c**level
        n = -(-length // dil)
        algorithm = choose_algorithm(c, dil, length, dtype, device)
        if algorithm == "cpp":  # the C++ operator: q, k, v as views of the qkv output, fp32 probs
            step = (3 * d * b + 4 * h * c) * tokens
        elif algorithm == "triton":  # the Triton kernel: q, k, v as views of the qkv output, fp32 log-sum-exp
            step = (3 * d * b + 4 * h) * tokens
        elif algorithm == "shift":
            q = 3 * d * b * tokens if n * dil == length else d * b * batch * dil * n
            step = q + 2 * d * b * batch * dil * (n + c - 1) + 4 * h * c * batch * dil * n
        else:
            rows = batch * dil * -(-n // c) * c  # queries padded to whole blocks of C
            step = 5 * d * b * rows + h * 2 * c * probs * rows
        out += [float(step)] * cfg.thickness
    return out


def activation_bytes(cfg: Config, length: int | None = None, batch: int | None = None,
                     checkpointing: bool | None = None, device: str = "cuda") -> float:
    """Peak activation bytes of one micro-batch's forward+backward (module docstring). `device` picks the attention
    algorithm each model runs there: RegularGPT's `choose_algorithm` at every depth step (CUDA today: the
    shift/blocked rule), ALiBi's FlexAttention on "cuda" and its query-chunked path on "cpu"."""
    m = cfg.model
    if m.head != "lm" or m.architecture not in ("regular_gpt", "transformer"):
        raise ConfigError(f"model.architecture: {m.architecture!r} with head {m.head!r} is not modelled by the "
                          "planner; expected a language model ('regular_gpt' or 'transformer', head 'lm')")
    if m.architecture == "transformer" and m.position not in ("alibi", "none", "sinusoidal"):
        raise ConfigError(f"model.position: {m.position!r} is not modelled by the planner; expected alibi, none or "
                          "sinusoidal (the other schemes save extra bias or rotation tensors)")
    t = cfg.data.seq_len if length is None else length
    bsz = cfg.train.batch_size if batch is None else batch
    ac = cfg.train.activation_checkpointing if checkpointing is None else checkpointing
    b, d, tokens = precision_bytes(cfg.train.precision), m.d_model, bsz * t
    common = (b * (5 * d + 2 * m.ffn_mult * d) + 4 * b) * tokens  # LN in/stats, matmul inputs, FFN hidden ×2
    apps = [common + a for a in _attention_bytes(m, t, bsz, b, device)]
    head = (2 * d * b + 2 * b + 4 * m.vocab_size) * tokens
    loss_transient = (b + 4 if b != 4 else 4) * m.vocab_size * tokens
    stored = b * d * tokens * len(apps) + max(apps) if ac else sum(apps)
    return float(stored + head + loss_transient)


@dataclass(frozen=True)
class MemoryEstimate:
    stage: int
    weights: float
    grads: float
    optimizer: float
    buffers: float
    activations: float
    activations_ac: float

    def total(self, checkpointing: bool) -> float:
        acts = self.activations_ac if checkpointing else self.activations
        return self.weights + self.grads + self.optimizer + self.buffers + acts


def estimate(cfg: Config, ranks: int, stage: int, length: int | None = None, batch: int | None = None,
             device: str = "cuda", size: ModelSize | None = None) -> MemoryEstimate:
    """Per-rank bytes at one ZeRO stage; `cfg.deepspeed`'s reduce_bucket_size/stage3_max_live_parameters apply."""
    size = size or model_size(cfg.model)
    zero = cfg.deepspeed.get("zero_optimization", {}) if isinstance(cfg.deepspeed, dict) else {}
    states = model_state_bytes(size, stage, ranks, cfg.train.precision)
    buffers = zero_buffers(size, stage, cfg.train.precision, int(zero.get("reduce_bucket_size", DEFAULT_BUCKET)),
                           int(zero.get("stage3_max_live_parameters", DEFAULT_MAX_LIVE)))
    return MemoryEstimate(stage, states["weights"], states["grads"], states["optimizer"], buffers,
                          activation_bytes(cfg, length, batch, False, device),
                          activation_bytes(cfg, length, batch, True, device))


def step_seconds(cfg: Config, cluster: Cluster, length: int | None = None, checkpointing: bool | None = None) -> float:
    """One optimizer step: step_flops (B·T·(3·(A + h) + [checkpointing]·A)) × grad_accum ÷ (peak × MFU).

    Worked example: base RegularGPT, T 512, B 32 → 3·(12·(2·(4d² + 8d²) + 4·8·d) + 2·d·V) = 5.47e8 FLOP/token,
    × 16,384 tokens ÷ (312e12 × 0.35) = 82 ms.
    """
    t = cfg.data.seq_len if length is None else length
    ac = cfg.train.activation_checkpointing if checkpointing is None else checkpointing
    flops = step_flops(cfg, t, cfg.train.batch_size, ac) * cfg.train.grad_accum
    return flops / (cluster.peak_tflops * 1e12 * cluster.mfu)


def choose_stage(cfg: Config, cluster: Cluster, device: str = "cuda") -> tuple[int | None, str]:
    """The lowest ZeRO stage whose per-rank estimate (the config's T, B and checkpointing) fits, and why."""
    size = model_size(cfg.model)
    ac = cfg.train.activation_checkpointing
    for stage in (0, 1, 2, 3):
        need = estimate(cfg, cluster.ranks, stage, device=device, size=size).total(ac)
        if need <= cluster.usable_bytes:
            lower = "" if stage == 0 else "; every lower stage needs more than the usable memory"
            return stage, (f"ZeRO-{stage} is the lowest stage that fits: {need / GIB:.2f} GiB of "
                           f"{cluster.usable_bytes / GIB:.2f} GiB usable per rank{lower} (a lower stage "
                           "communicates less: ZeRO 0–2 all-reduce/reduce-scatter gradients once per step, ZeRO-3 "
                           "also gathers the weights in every forward and backward)")
    need = estimate(cfg, cluster.ranks, 3, device=device, size=size).total(ac)
    return None, (f"nothing fits: ZeRO-3 needs {need / GIB:.2f} GiB per rank of {cluster.usable_bytes / GIB:.2f} GiB; "
                  "turn on activation checkpointing, lower train.batch_size or data.seq_len, or add GPUs")


def longest_length(cfg: Config, cluster: Cluster, stage: int, checkpointing: bool, batch: int | None = None,
                   device: str = "cuda", limit: int = 1 << 24) -> int:
    """The longest training length T whose per-rank estimate fits (0 if even T = 1 does not); memory grows with T,
    so a binary search. RegularGPT's depth is re-derived at every T; `limit` caps the search."""
    size = model_size(cfg.model)

    def fits(t: int) -> bool:
        e = estimate(replace(cfg, data=replace(cfg.data, seq_len=t)), cluster.ranks, stage, t, batch, device, size)
        return e.total(checkpointing) <= cluster.usable_bytes

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
