"""Typed, validated run configuration loaded from JSON.

A config file is a JSON object with up to six sections::

    {"extends": "../base.json",            # optional, path relative to this file; merged recursively
     "model": {...}, "data": {...}, "train": {...}, "eval": {...}, "logging": {...},
     "deepspeed": {...}}                   # passed through to DeepSpeed unchanged (a plain dict)

Every section is a frozen dataclass below that validates itself in ``__post_init__``, so an invalid config object
cannot exist (``dataclasses.replace`` validates too) and code below trusts the values it reads. Loading is strict: an
unknown key, a wrong type or an impossible value raises :class:`ConfigError`, whose message names the file, the key
path, the value and what is allowed, e.g.::

    configs/tiny/regular_gpt.json: model.chunk_sise: unknown key; did you mean 'chunk_size'?
    configs/tiny/regular_gpt.json: train.lr: 0.0 is not allowed; expected a number > 0

There is one config class per trainer, each holding only the fields its trainer reads (setting the other trainer's
key is an unknown-key error); ``load_config(path, kind=...)`` picks the class::

    section    Config (language models)                    FormalConfig (formal languages)
    model      ModelConfig                                 ModelConfig, head "classifier"
    data       DataConfig: path, seq_len                   FormalDataConfig: task, task_options, min_length, max_length
    train      TrainConfig                                 FormalTrainConfig (no schedule, accumulation, ZeRO...)
    eval       EvalConfig: lengths, protocol, stride,      FormalEvalConfig: max_length, samples_per_length,
               tokens, memory_gb                           score_min_length
    logging    LoggingConfig                               LoggingConfig
    deepspeed  a pass-through dict                         (none)

Run configs saved before the split (one ``data`` and one ``eval`` section holding both trainers' fields, and formal
runs saved as a whole Config) are read by :func:`config_from_saved` and :func:`formal_config_from_saved`.

Command-line overrides use dotted paths and are converted to the field's type: ``--set model.chunk_size=4``,
``--set train.lr=3e-4``, ``--set eval.lengths=64,128,256``. A resolved config round-trips through JSON unchanged:
``load_config_dict(config_to_dict(cfg)) == cfg``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from regulargpt.errors import UserError
from regulargpt.files import atomic_write_text, read_json_object

__all__ = [
    "ConfigError",
    "ModelConfig",
    "DataConfig",
    "TrainConfig",
    "EvalConfig",
    "LoggingConfig",
    "Config",
    "FormalDataConfig",
    "FormalTrainConfig",
    "FormalEvalConfig",
    "FormalConfig",
    "config_from_saved",
    "formal_config_from_saved",
    "load_config",
    "load_config_dict",
    "config_to_dict",
    "apply_overrides",
    "build_section",
    "read_json",
    "save_config",
    "merge_dicts",
]


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
    "none", "sinusoidal", "learned", "rope", "alibi", "t5", "kerple_log", "kerple_power", "xl_relative"
]


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
        if self.position == "rope" and (self.d_model // self.n_heads) % 2:
            self._fail("position", "rope", f"an even head dimension (d_model/n_heads = {self.d_model // self.n_heads})")
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
        if self.depth_policy != "adaptive" and (self.architecture != "regular_gpt" or self.head != "lm"):
            self._fail("depth_policy", self.depth_policy,
                  "'adaptive' unless architecture is 'regular_gpt' with head 'lm' (tree mode reads one position)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class DataConfig(_Section):
    """The language-model trainer's training data: a token-shard folder, read in windows of `seq_len` tokens."""

    path: str = ""  # folder written by data_prep/prepare.py
    seq_len: int = 512  # language-model training length T

    section: ClassVar[str] = "data"

    def __post_init__(self) -> None:
        self._positive("seq_len")


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
    # torch.compile the model in place (nn.Module.compile: same module, names and state dict) before DeepSpeed wraps
    # it. Off by default: measured on this CPU (docs/PERFORMANCE.md, "torch.compile") it costs ~20-90 CPU-seconds
    # of compilation per run and shape.
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

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive("grad_accum", "eval_batches", "keep_last", "dist_timeout_s")
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
    tokens: int = 0  # tokens scored per length; 0 = as many as the split holds at the longest length
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
    1..max_length; the score is the mean accuracy over score_min_length..max_length (41..500: the unseen lengths)."""

    max_length: int = 500
    samples_per_length: int = 512
    score_min_length: int = 41

    section: ClassVar[str] = "eval"

    def __post_init__(self) -> None:
        self._positive("max_length", "samples_per_length", "score_min_length")


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


@dataclass(frozen=True)
class Config:
    """The language-model trainer's config (launch/pretrain.py): ``model.head`` is "lm"; formal-language training
    (a sequence classifier) uses :class:`FormalConfig`.

    Every section validates itself on construction, and this class checks what spans sections, so a Config that
    exists is valid (``dataclasses.replace`` validates too). `model.train_length` 0 is resolved here to
    `data.seq_len` for a RegularGPT language model, so a saved one carries the length its ``train`` depth policy needs.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    deepspeed: dict[str, Any] = field(default_factory=dict)  # merged over the DeepSpeed config built from `train`

    def __post_init__(self) -> None:
        model = self.model
        if model.head != "lm":
            raise ConfigError(f"model.head: {model.head!r} is not allowed; expected 'lm' (a sequence classifier is "
                              f"trained by the formal-language trainer, whose config is FormalConfig)")
        if model.train_length == 0 and model.architecture == "regular_gpt" and model.head == "lm":
            object.__setattr__(self, "model", dataclasses.replace(model, train_length=self.data.seq_len))
        _check_deepspeed_passthrough(self.deepspeed, self.train)


@dataclass(frozen=True)
class FormalConfig:
    """The formal-language trainer's config (launch/train_formal.py, the formal sweeps): a sequence classifier
    trained in one process with Adam at a constant rate, so the language-model trainer's schedule, accumulation,
    precision, ZeRO and DeepSpeed settings are not fields here (setting one is an unknown-key error).

    Its ``data`` and ``eval`` sections have the same names as the language-model trainer's but their own fields
    (:class:`FormalDataConfig`, :class:`FormalEvalConfig`): ``data.seq_len`` or ``eval.lengths`` here is an
    unknown-key error, as ``data.task`` is in a :class:`Config`.
    """

    model: ModelConfig = field(default_factory=lambda: ModelConfig(head="classifier", num_classes=2))
    data: FormalDataConfig = field(default_factory=FormalDataConfig)
    train: FormalTrainConfig = field(default_factory=FormalTrainConfig)
    eval: FormalEvalConfig = field(default_factory=FormalEvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        if self.model.head != "classifier":
            raise ConfigError(f"model.head: {self.model.head!r} is not allowed; expected 'classifier' (formal-language "
                              f"training trains a sequence classifier)")


# DeepSpeed keys the typed `train` fields set (regulargpt.train.engine.deepspeed_config): a pass-through value may
# repeat them but not contradict them, or the engine would run one setting while the run records (and exports as)
# the other. key path -> (the typed field, its value as DeepSpeed sees it).
_DEEPSPEED_TYPED = {
    "train_micro_batch_size_per_gpu": ("train.batch_size", lambda t: t.batch_size),
    "gradient_accumulation_steps": ("train.grad_accum", lambda t: t.grad_accum),
    "gradient_clipping": ("train.grad_clip", lambda t: t.grad_clip),
    "zero_optimization.stage": ("train.zero_stage", lambda t: t.zero_stage),
    "bf16.enabled": ("train.precision", lambda t: t.precision == "bf16"),
    "bfloat16.enabled": ("train.precision", lambda t: t.precision == "bf16"),
    "fp16.enabled": ("train.precision", lambda t: t.precision == "fp16"),
}
# Keys that have no single typed field: derived, or owned by our client optimizer and LR schedule.
_DEEPSPEED_REFUSED = {
    "train_batch_size": "it is derived: train.batch_size x train.grad_accum x processes; set those instead",
    "optimizer": "the optimizer is AdamW from train.lr, beta1, beta2, eps and weight_decay; set those instead",
    "scheduler": "the LR schedule comes from train.schedule, warmup_fraction and min_lr_ratio; set those instead",
}


def _check_deepspeed_passthrough(ds: dict[str, Any], train: TrainConfig) -> None:
    """ConfigError for a ``deepspeed.*`` key that contradicts a typed field or that the trainer owns.

    >>> _check_deepspeed_passthrough({"zero_optimization": {"stage": 7}}, TrainConfig())  # doctest: +SKIP
    ConfigError: deepspeed.zero_optimization.stage: 7 contradicts train.zero_stage=0 ...
    """
    for key, why in _DEEPSPEED_REFUSED.items():
        if key in ds:
            raise ConfigError(f"deepspeed.{key}: {ds[key]!r} is not allowed; {why}")
    for path, (field_name, typed) in _DEEPSPEED_TYPED.items():
        node: Any = ds
        for part in path.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT and node != typed(train):
            raise ConfigError(f"deepspeed.{path}: {node!r} contradicts {field_name}={getattr(train, field_name[6:])!r} "
                              f"(the engine would run one, the run record the other); set {field_name} instead")


_ABSENT = object()


# ----------------------------------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is dict:
        return "a JSON object"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Type-check one JSON value against a field type; returns the value converted (int -> float for float fields)."""
    origin = typing.get_origin(tp)
    ok: bool
    if origin is Literal:
        ok = value in typing.get_args(tp) and type(value) is type(typing.get_args(tp)[0])
    elif origin is list:
        if isinstance(value, list):
            return [_check_value(v, typing.get_args(tp)[0], f"{where}[{i}]") for i, v in enumerate(value)]
        ok = False
    elif origin is dict:
        ok = isinstance(value, dict)
    elif tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise ConfigError(f"{where}: {value!r} is not allowed; expected a finite number")
        if ok:
            return float(value)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"unsupported config field type {tp}")
    if not ok:
        raise ConfigError(f"{where}: {value!r} has the wrong type; expected {_type_name(tp)}")
    return value


def _did_you_mean(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else "allowed keys: " + ", ".join(sorted(allowed))


def build_section(cls: type, raw: Any, where: str) -> Any:
    """Dataclass `cls` from a JSON object, strictly: unknown keys (with a did-you-mean hint) and wrong types are
    ConfigErrors naming ``where.key``. Used for config sections and other JSON files (sweep profiles)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(f"{where}.{key}: unknown key; {_did_you_mean(key, names)}")
        kwargs[key] = _check_value(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


AnyConfig = TypeVar("AnyConfig", Config, FormalConfig)


def _sections(kind: type) -> dict[str, Any]:
    """Top-level key -> its type: a section dataclass, or ``dict[str, Any]`` for a pass-through object."""
    return typing.get_type_hints(kind)


def load_config_dict(raw: dict[str, Any], source: str = "<dict>", kind: type[AnyConfig] = Config) -> AnyConfig:
    """Build a validated `kind` (:class:`Config` or :class:`FormalConfig`) from an already-merged dict (no
    ``extends``); ConfigError naming `source` and the key for an unknown key, a wrong type or an impossible value."""
    try:
        if not isinstance(raw, dict):
            raise ConfigError(f"top level: expected a JSON object, got {type(raw).__name__}")
        types = _sections(kind)
        for key in raw:
            if key not in types:
                raise ConfigError(f"{key}: unknown section; {_did_you_mean(key, list(types))}")
        values: dict[str, Any] = {}
        for name, tp in types.items():
            if dataclasses.is_dataclass(tp):
                values[name] = build_section(tp, raw.get(name, {}), name)
            elif isinstance(raw.get(name, {}), dict):
                values[name] = dict(raw.get(name, {}))
            else:
                raise ConfigError(f"{name}: expected a JSON object, got {raw[name]!r}")
        return kind(**values)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


# The keys `data` and `eval` held for the formal trainer while both trainers shared those sections (up to commit
# 0152525), with the defaults at which every language-model run saved them.
_FORMAL_KEYS_BEFORE_SPLIT = {"data": {"task": "", "task_options": {}, "min_length": 1, "max_length": 40},
                             "eval": {"max_length": 500, "samples_per_length": 512, "score_min_length": 41}}


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def config_from_saved(raw: dict[str, Any], source: str) -> Config:
    """A :class:`Config` from a language-model run's saved config (``config.resolved.json``, a model file's
    config), also in the layout written while ``data`` and ``eval`` held the formal trainer's fields too: those
    keys are dropped when they hold the defaults every language-model run saved; any other value is a ConfigError
    (such a file did not come from the language-model trainer)."""
    if isinstance(raw, dict):
        raw = dict(raw)
        for name, old_defaults in _FORMAL_KEYS_BEFORE_SPLIT.items():
            section = raw.get(name)
            if not isinstance(section, dict):
                continue
            for key, value in section.items():
                if key in old_defaults and value != old_defaults[key]:
                    raise ConfigError(f"{source}: {name}.{key}: {value!r} is a formal-language setting, not allowed "
                                      f"in a language-model config (only its old default {old_defaults[key]!r} "
                                      f"is dropped); a formal-language model has model.head 'classifier'")
            raw[name] = {k: v for k, v in section.items() if k not in old_defaults}
    return load_config_dict(raw, source, Config)


def formal_config_from_saved(raw: dict[str, Any], source: str) -> FormalConfig:
    """A :class:`FormalConfig` from a formal run's saved config, also in the layouts written before it had its own
    sections: a whole :class:`Config` (before FormalConfig existed), and ``data``/``eval`` sections shared with the
    language-model trainer. The language-model-only keys of those layouts (``deepspeed``, ``train.schedule``,
    ``grad_accum``, ``precision``, ``zero_stage``, ..., ``data.path``, ``data.seq_len``, ``eval.lengths``,
    ``protocol``, ...) the formal trainer either required at their defaults or never read, so they are dropped."""
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k != "deepspeed"}
        for name, lm, formal in (("data", DataConfig, FormalDataConfig), ("train", TrainConfig, FormalTrainConfig),
                                 ("eval", EvalConfig, FormalEvalConfig)):
            lm_only = _field_names(lm) - _field_names(formal)
            if isinstance(raw.get(name), dict):
                raw[name] = {k: v for k, v in raw[name].items() if k not in lm_only}
    return load_config_dict(raw, source, FormalConfig)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON config object from `path` (:func:`regulargpt.files.read_json_object`); ConfigError naming the file
    (and line and column when it is malformed)."""
    return read_json_object(path, ConfigError, kind="config file")


def merge_dicts(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; `over` wins. Lists and scalars are replaced, objects merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge_dicts(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _load_raw(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"{path}: 'extends' cycle: " + " -> ".join(str(p) for p in chain + (path,)))
    raw = read_json(path)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends: {parent!r} has the wrong type; expected a relative path string")
    return merge_dicts(_load_raw(path.parent / parent, chain + (path,)), raw)


def _parse_override_value(text: str, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    try:
        if origin is list:
            inner = typing.get_args(tp)[0]
            return [_parse_override_value(t.strip(), inner, where) for t in text.split(",") if t.strip()]
        if origin is dict:
            return json.loads(text)
        if tp is bool or (origin is Literal and isinstance(typing.get_args(tp)[0], bool)):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if tp is int or (origin is Literal and isinstance(typing.get_args(tp)[0], int)):
            return int(text)
        if tp is float:
            return float(text)
    except (ValueError, json.JSONDecodeError):
        raise ConfigError(f"--set {where}={text}: cannot convert {text!r} to {_type_name(tp)}") from None
    return text


def apply_overrides(raw: dict[str, Any], overrides: list[str], kind: type = Config) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw `kind` config dict, converting each value to its field's type.

    ``deepspeed.*`` keys take JSON values (``--set deepspeed.zero_optimization={"stage":2}``) or plain strings.
    """
    out = json.loads(json.dumps(raw))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. model.chunk_size=4")
        path, text = item.split("=", 1)
        parts = path.strip().split(".")
        sections = {name: tp for name, tp in _sections(kind).items() if dataclasses.is_dataclass(tp)}
        if parts[0] in _sections(kind) and parts[0] not in sections and len(parts) >= 2:  # a pass-through object
            try:
                value: Any = json.loads(text)
            except json.JSONDecodeError:
                value = text
            node = out.setdefault(parts[0], {})
            for p in parts[1:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
            continue
        if len(parts) != 2 or parts[0] not in sections:
            hint = _did_you_mean(parts[0], list(sections)) if parts[0] not in sections else "use SECTION.KEY"
            raise ConfigError(f"--set {item}: {path!r} is not a SECTION.KEY path; {hint}")
        section, key = parts
        cls = sections[section]
        names = [f.name for f in dataclasses.fields(cls)]
        if key not in names:
            raise ConfigError(f"--set {item}: {section}.{key}: unknown key; {_did_you_mean(key, names)}")
        out.setdefault(section, {})[key] = _parse_override_value(text, typing.get_type_hints(cls)[key], path)
    return out


def load_config(path: str | Path, overrides: list[str] | None = None, kind: type[AnyConfig] = Config) -> AnyConfig:
    """Load a JSON config (following ``extends``), apply ``--set`` overrides, and validate it as `kind`.

    >>> cfg = load_config("configs/tiny/regular_gpt.json", ["model.chunk_size=4"])  # doctest: +SKIP
    >>> cfg = load_config("configs/formal/parity_check.json", kind=FormalConfig)  # doctest: +SKIP
    """
    path = Path(path)
    raw = _load_raw(path)
    try:
        raw = apply_overrides(raw, overrides or [], kind)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return load_config_dict(raw, str(path), kind)


def config_to_dict(cfg: Config | FormalConfig) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (no ``extends``)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config | FormalConfig, path: str | Path) -> None:
    """Write the resolved config atomically (temporary file + rename)."""
    atomic_write_text(Path(path), json.dumps(config_to_dict(cfg), indent=2, sort_keys=True) + "\n")

