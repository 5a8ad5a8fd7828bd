"""The config sections: one frozen dataclass per JSON section, each validating itself in ``__post_init__`` and
naming a failure ``<section>.<key>`` (a :class:`ConfigError`), e.g. ``train.lr: 0.0 is not allowed; expected a number
> 0``. The whole-run classes that hold them are in :mod:`regulargpt.config.run_configs`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, ClassVar, Literal

from regulargpt.config.rope_scaling import RopeScalingError, check_rope_scaling
from regulargpt.errors import UserError


class ConfigError(UserError, ValueError):
    """A config problem a user can fix; the message names the file, the key path, the value and what is allowed."""


class _Section:
    """Base of the config sections: a section validates itself in ``__post_init__`` and names its failures
    ``<section>.<key>``."""

    section: ClassVar[str] = ""

    def _fail(self, key: str, value: Any, expected: str) -> typing.NoReturn:
        raise ConfigError(f"{self.section}.{key}: {value!r} is not allowed; expected {expected}")

    def _positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) <= 0:
                self._fail(name, getattr(self, name), "a number > 0")


Architecture = Literal["regular_gpt", "transformer", "rnn", "lstm"]
Position = Literal[
    "none", "sinusoidal", "learned", "rope", "alibi", "t5", "kerple_log", "kerple_power", "xl_relative", "fire",
    "xpos", "sandwich"
]
_ROTARY = ("rope", "xpos")  # positions that rotate q and k: an even head dimension


@dataclass(frozen=True)
class ModelConfig(_Section):
    """The network. `architecture` picks the family; the other fields apply where they make sense.

    RegularGPT: `chunk_size` C, `thickness` K, adaptive depth ceil(log_C T) depth steps of one shared block of K
    sub-layers. Transformer baseline: `n_layers` dense causal layers with the `position` scheme.
    """

    architecture: Architecture = "regular_gpt"
    head: Literal["lm", "classifier"] = "lm"  # lm: every position predicts the next token; classifier: last position
    vocab_size: int = 256
    num_classes: int = 0  # classifier only (>= 2)
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4  # transformer / rnn / lstm only
    ffn_mult: int = 4  # FFN hidden width = ffn_mult * d_model
    chunk_size: int = 2  # RegularGPT C
    thickness: int = 1  # RegularGPT K
    pad: Literal["learned", "mask"] = "learned"  # RegularGPT: out-of-range keys read the learned pad state, or are masked
    norm: Literal["pre", "post"] = "pre"
    activation: Literal["gelu", "relu"] = "gelu"
    position: Position = "none"  # transformer only (xl_relative: Transformer-XL relative encoding, classifier baseline)
    max_positions: int = 0  # learned absolute positions only: the longest input the model accepts
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    rope_base: float = 10000.0
    # RoPE scaling at inference, Hugging Face's rope_scaling object (regulargpt.config.rope_scaling); {} = none.
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    xpos_gamma: float = 0.4  # xPos: ζ_i = (2i/Dh + γ)/(1 + γ)
    xpos_scale_base: float = 512.0  # xPos: q scaled by ζ^(n/B), k by ζ^(−m/B)
    fire_mlp_width: int = 32  # FIRE: hidden units of f_θ
    fire_init_c: float = 0.1  # FIRE: ψ(x) = log(c·x + 1), c learnable
    fire_init_threshold: float = 512.0  # FIRE: L0 of the learnable threshold L = |λ|·L0
    sandwich_dim: int = 128  # Sandwich: d', the dimension of the sinusoidal vectors whose inner product is the bias
    dropout: float = 0.0
    qkv_bias: bool = False
    embedding_scale: bool = False  # multiply token embeddings by sqrt(d_model) (the authors' formal-language models)
    tie_embeddings: bool = False
    init_std: float = 0.02
    # Initialisation scheme of linear layers: "normal" = N(0, init_std) (GPT-2/NeoX); "fan_in" = Haiku's default, a
    # normal truncated at ±2σ with σ = 1/sqrt(fan_in) (the authors' formal-language code).
    init: Literal["normal", "fan_in"] = "normal"
    embedding_init_std: float = 0.0  # token embeddings N(0, σ) (before embedding_scale); 0 = init_std
    # RegularGPT (see docs/EVALUATION.md "The knobs"):
    depth_policy: Literal["adaptive", "train", "per_position"] = "adaptive"  # depth steps at inference length T
    train_length: int = 0  # the training length T_train behind depth_policy="train"; 0 = data.seq_len
    rel_bias_init: Literal["normal", "zeros", "recency"] = "normal"  # window scalars r: N(0, 0.02), 0, −s_h·j
    depth_scaled_init: bool = False  # output projections (attention, FFN) at init std / sqrt(2 · layer applications)
    attention_memory_mb: int = 256  # dense baselines: query-chunk size is chosen so one score block stays under this
    # Dense baselines: causal sliding window, each query sees its last `window` keys (itself included); 0 = every
    # earlier key. The windowed baseline of the LM study uses W = T_train (regulargpt.model.window_attention).
    window: int = 0

    section: ClassVar[str] = "model"

    def __post_init__(self) -> None:
        self._positive("vocab_size", "d_model", "n_heads", "n_layers", "ffn_mult", "attention_memory_mb")
        if self.d_model % self.n_heads:
            self._fail("d_model", self.d_model, f"a multiple of n_heads={self.n_heads}")
        if self.chunk_size < 2:
            self._fail("chunk_size", self.chunk_size, "an integer >= 2 (C = 1 would never grow the receptive field)")
        if self.thickness < 1:
            self._fail("thickness", self.thickness, "an integer >= 1")
        if self.head == "classifier" and self.num_classes < 2:
            self._fail("num_classes", self.num_classes, "an integer >= 2 when head is 'classifier'")
        if self.architecture != "transformer" and self.position not in ("none",):
            self._fail("position", self.position, f"'none' for architecture {self.architecture!r} (positions are transformer-only)")
        if self.architecture in ("rnn", "lstm") and self.head != "classifier":
            self._fail("head", self.head, "'classifier' for rnn/lstm (they are formal-language baselines)")
        if self.position == "learned" and self.max_positions < 1:
            self._fail("max_positions", self.max_positions, "an integer >= 1 when position is 'learned'")
        if self.position in _ROTARY and (self.d_model // self.n_heads) % 2:
            self._fail("position", self.position,
                       f"an even head dimension (d_model/n_heads = {self.d_model // self.n_heads})")
        self._check_position_knobs()
        if not 0.0 <= self.dropout < 1.0:
            self._fail("dropout", self.dropout, "a probability in [0, 1)")
        if self.t5_num_buckets < 2 or self.t5_max_distance <= self.t5_num_buckets // 2:
            self._fail("t5_max_distance", self.t5_max_distance, f"> t5_num_buckets // 2 = {self.t5_num_buckets // 2}")
        if self.rope_base <= 1.0:
            self._fail("rope_base", self.rope_base, "a number > 1")
        if self.init_std <= 0:
            self._fail("init_std", self.init_std, "a number > 0")
        if self.embedding_init_std < 0:
            self._fail("embedding_init_std", self.embedding_init_std, "a number >= 0 (0 = init_std)")
        if self.train_length < 0:
            self._fail("train_length", self.train_length, "an integer >= 0 (0 = data.seq_len)")
        if self.window < 0:
            self._fail("window", self.window, "an integer >= 0 (0 = full causal attention)")
        if self.window and self.architecture != "transformer":
            self._fail("window", self.window, f"0 for architecture {self.architecture!r} (the sliding window is a "
                       f"dense-transformer option; RegularGPT's window is C^L_train under depth_policy 'train')")
        if self.window and self.position == "xl_relative":
            self._fail("window", self.window, "0 with position 'xl_relative' (its relative attention is not windowed)")
        if self.depth_policy != "adaptive" and (self.architecture != "regular_gpt" or self.head != "lm"):
            self._fail("depth_policy", self.depth_policy,
                  "'adaptive' unless architecture is 'regular_gpt' with head 'lm' (tree mode reads one position)")

    def __hash__(self) -> int:  # explicit: the rope_scaling dict is hashed as its canonical JSON
        return hash(tuple(json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                          for v in (getattr(self, f.name) for f in dataclasses.fields(self))))

    def _check_position_knobs(self) -> None:
        """rope_scaling (RoPE only), xPos, FIRE and Sandwich hyperparameters."""
        try:
            scaling = check_rope_scaling(self.rope_scaling, f"{self.section}.rope_scaling")
        except RopeScalingError as err:
            raise ConfigError(str(err)) from None
        object.__setattr__(self, "rope_scaling", scaling)  # normalised (floats, defaults dropped)
        if scaling and self.position != "rope":
            self._fail("rope_scaling", scaling, f"{{}} for position {self.position!r} (a RoPE scaling needs "
                       f"position 'rope')")
        self._positive("xpos_scale_base", "fire_mlp_width", "fire_init_c", "fire_init_threshold", "sandwich_dim")
        if self.xpos_gamma < 0:
            self._fail("xpos_gamma", self.xpos_gamma, "a number >= 0")
        if self.sandwich_dim % 2:
            self._fail("sandwich_dim", self.sandwich_dim, "an even integer (d'/2 sinusoid pairs)")
        if self.window and self.position == "fire":
            self._fail("window", self.window, "0 with position 'fire' (its bias reads the query position; the "
                       "windowed kernel reuses one bias block for every band)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class DataConfig(_Section):
    """The language-model trainer's training data, read in windows of `seq_len` tokens: one token-shard folder
    (`path`), or a mixture of several (`paths`) where a sequence comes from folder k with probability
    w_k = weights[k] / sum(weights) (empty `weights`: in proportion to each folder's train tokens; the sampler is
    regulargpt.data.mixture, docs/MIXTURES.md). E.g. paths ["data/web", "data/code"], weights [3, 1]: 75% / 25%."""

    path: str = ""  # folder written by data_prep/prepare.py
    paths: list[str] = field(default_factory=list)  # a mixture of >= 2 such folders (instead of `path`)
    weights: list[float] = field(default_factory=list)  # one number > 0 per `paths` entry; [] = by train tokens
    seq_len: int = 512  # language-model training length T
    # how the splits are checked against the manifest at every start: size, blocks (size + 64 sampled 64 KiB
    # blocks) or full (+ the whole file's sha256, once per file version); regulargpt.data.verify, docs/DATA.md
    verify: Literal["size", "blocks", "full"] = "blocks"

    section: ClassVar[str] = "data"

    def __post_init__(self) -> None:
        self._positive("seq_len")
        if self.path and self.paths:
            self._fail("paths", self.paths, f"[] when data.path is set ({self.path!r}): set one of data.path (one "
                       f"folder) or data.paths (a mixture); for a mixture also pass --set data.path= (empty), or "
                       f"\"path\": \"\" in the config file")
        if len(self.paths) == 1:
            self._fail("paths", self.paths, "two or more folders (one folder is data.path)")
        names = [PurePath(p).name for p in self.paths]
        for i, name in enumerate(names):
            if not name:
                self._fail(f"paths[{i}]", self.paths[i], "a folder path")
            if name in names[:i]:
                j = names.index(name)
                same = os.path.normpath(self.paths[i]) == os.path.normpath(self.paths[j])
                self._fail(f"paths[{i}]", self.paths[i], f"a folder not listed already (data.paths[{j}])" if same else
                           f"a folder whose name differs from data.paths[{j}]={self.paths[j]!r} (metrics and "
                           f"evaluation rows name a corpus by its folder name)")
        if self.weights and not self.paths:
            self._fail("weights", self.weights, "[] without data.paths (weights mix the data.paths folders)")
        if self.weights and len(self.weights) != len(self.paths):
            self._fail("weights", self.weights, f"one number > 0 per data.paths entry ({len(self.paths)}), or [] "
                       f"for weights in proportion to each folder's train tokens")
        for i, weight in enumerate(self.weights):
            if not (math.isfinite(weight) and weight > 0):
                self._fail(f"weights[{i}]", weight, "a finite number > 0 (weights are normalised to sum to 1)")

    @property
    def folders(self) -> list[str]:
        """The folders trained on: `paths`, or [`path`] (or [] when neither is set)."""
        return list(self.paths) or ([self.path] if self.path else [])


@dataclass(frozen=True)
class FormalDataConfig(_Section):
    """The formal-language trainer's training data: a task (regulargpt.tasks), each batch at one length drawn
    uniformly from min_length..max_length, e.g. parity_check at 1..40."""

    task: str = ""  # formal-language task name (regulargpt.tasks.TASK_NAMES)
    task_options: dict[str, Any] = field(default_factory=dict)
    min_length: int = 1
    max_length: int = 40

    section: ClassVar[str] = "data"

    def __post_init__(self) -> None:
        self._positive("min_length", "max_length")
        if self.max_length < self.min_length:
            self._fail("max_length", self.max_length, f">= min_length={self.min_length}")


@dataclass(frozen=True)
class FormalTrainConfig(_Section):
    """Optimisation in the formal-language trainer: one process, Adam, global-norm clipping, a constant rate.

    `batch_size` is the whole batch of one step (the paper's 128); `steps` counts optimizer steps.
    """

    seed: int = 0
    steps: int = 1000
    lr: float = 3e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    batch_size: int = 32  # the whole batch of one step
    grad_clip: float = 1.0  # global-norm clipping; 0 disables
    log_every: int = 10
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end
    max_bad_steps: int = 10  # NaN/Inf steps skipped before the run stops

    section: ClassVar[str] = "train"

    def __post_init__(self) -> None:
        self._positive("steps", "lr", "eps", "batch_size", "log_every")
        if self.seed < 0:
            self._fail("seed", self.seed, "an integer >= 0")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                self._fail(name, getattr(self, name), "a number in [0, 1)")
        for name in ("weight_decay", "grad_clip", "save_every", "max_bad_steps"):
            if getattr(self, name) < 0:
                self._fail(name, getattr(self, name), "a number >= 0")


@dataclass(frozen=True)
class TrainConfig(FormalTrainConfig):
    """Optimisation in the language-model trainer: the formal trainer's fields, plus the LR schedule, gradient
    accumulation, precision, ZeRO, checkpoint cadence and validation. `steps` counts optimizer steps; one step =
    grad_accum micro-batches per rank.

    `batch_size` here is the micro-batch per rank: a step sees batch_size x grad_accum x ranks sequences.
    """

    batch_size: int = 32  # micro-batch per rank (global batch = batch_size x grad_accum x ranks)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_fraction: float = 0.0
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    grad_accum: int = 1
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    zero_stage: int = 0
    activation_checkpointing: bool = False
    # torch.compile the model in place (DeepSpeed's engine.compile = nn.Module.compile: same module, names and state
    # dict), every ZeRO stage (under ZeRO-3 DeepSpeed's parameter hooks split the graph at every module:
    # regulargpt.train.engine.compile_engine). Off by default: measured on this CPU (docs/PERFORMANCE.md,
    # "torch.compile") it costs ~20-90 CPU-seconds of compilation per run and shape.
    compile: bool = False
    eval_every: int = 0  # validation every N steps; 0 = only at the end
    eval_batches: int = 8
    keep_last: int = 2
    # Seconds a collective (all-reduce, barrier, ZeRO gather) waits for the other ranks before it fails: a hung or
    # unreachable node ends the job after at most this long (a crashed one at once: its sockets close). It must exceed
    # the longest work one rank does while the others wait at a barrier: rank 0 writing model.pt at the end.
    dist_timeout_s: float = 1800.0
    # Steps at which `launch/pretrain.py --extend-to` continued a finished run; the LR schedule is re-planned from
    # each (regulargpt.train.engine.lr_factor). Written by --extend-to, not meant to be set by hand.
    extended_from: list[int] = field(default_factory=list)
    # Divergence guard: a recorded training loss above divergence_factor x ln(vocab_size), the loss of a uniform
    # prediction, stops the run (exit 2) and names the last good checkpoint and a command with a lower lr
    # (regulargpt.train.divergence); 0 turns it off.
    divergence_factor: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive("grad_accum", "eval_batches", "keep_last", "dist_timeout_s")
        if self.divergence_factor != 0 and self.divergence_factor <= 1:
            self._fail("divergence_factor", self.divergence_factor, "0 (off) or a number > 1 (the loss limit is "
                       "divergence_factor x ln(vocab_size); an untrained model starts at ln(vocab_size))")
        if not 0.0 <= self.warmup_fraction < 1.0:
            self._fail("warmup_fraction", self.warmup_fraction, "a fraction in [0, 1)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            self._fail("min_lr_ratio", self.min_lr_ratio, "a fraction in [0, 1]")
        if self.zero_stage not in (0, 1, 2, 3):
            self._fail("zero_stage", self.zero_stage, "one of 0, 1, 2, 3")
        if self.eval_every < 0:
            self._fail("eval_every", self.eval_every, "a number >= 0")
        bounds = [0, *self.extended_from, self.steps]
        if any(a >= b for a, b in zip(bounds, bounds[1:])):
            self._fail("extended_from", self.extended_from, f"increasing steps between 0 and steps={self.steps}, exclusive")


@dataclass(frozen=True)
class EvalConfig(_Section):
    """How a language model is scored: the lengths and protocol eval/extrapolate.py reads from the run's saved config
    (its flags override them)."""

    lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192, 16384])
    protocol: Literal["nonoverlapping", "sliding"] = "nonoverlapping"
    stride: int = 0  # sliding protocol: 0 means half the window length (L/2)
    tokens: int = 1 << 21  # tokens scored per length (2,097,152, KERPLE-like eval-iters budget); 0 = the whole split
    memory_gb: float = 4.0  # evaluation batch size is chosen to stay under this

    section: ClassVar[str] = "eval"

    def __post_init__(self) -> None:
        if not self.lengths or any(not isinstance(x, int) or x < 1 for x in self.lengths):
            self._fail("lengths", self.lengths, "a non-empty list of integers >= 1")
        self._positive("memory_gb")
        if self.stride < 0 or self.tokens < 0:
            self._fail("stride" if self.stride < 0 else "tokens", min(self.stride, self.tokens), "an integer >= 0")


@dataclass(frozen=True)
class FormalEvalConfig(_Section):
    """Range evaluation of a formal-language classifier: `samples_per_length` strings at every length
    1..max_length; the score is the mean accuracy over score_min_length..max_length (41..500: the unseen lengths).

    The model evaluated is the one the run keeps (:mod:`regulargpt.train.formal_selection`): with ``select_last``
    N > 1, the best training-length fit among the models at steps train.steps − k·``select_every``, k < N; with
    N = 1 (default) the last model."""

    max_length: int = 500
    samples_per_length: int = 512
    score_min_length: int = 41
    select_last: int = 1  # keep the best fit of the last N checks (1 = the last model)
    select_every: int = 100  # steps between those checks

    section: ClassVar[str] = "eval"

    def __post_init__(self) -> None:
        self._positive("max_length", "samples_per_length", "score_min_length", "select_last", "select_every")
        if self.score_min_length > self.max_length:
            self._fail("score_min_length", self.score_min_length, f"<= max_length={self.max_length} (the score "
                       f"averages lengths score_min_length..max_length)")


@dataclass(frozen=True)
class LoggingConfig(_Section):
    """Console and experiment tracking. wandb runs offline when no API key is configured."""

    wandb: bool = False
    project: str = "regulargpt"
    run_name: str = ""
    progress: bool = True  # tqdm progress bars

    section: ClassVar[str] = "logging"

    def __post_init__(self) -> None:
        if self.wandb and not self.project:
            self._fail("project", self.project, "a non-empty wandb project name when wandb is on")
