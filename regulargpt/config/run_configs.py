"""The whole-run config classes, one per trainer: :class:`Config` (language-model pretraining, with a DeepSpeed
pass-through section checked against the typed ``train`` fields) and :class:`FormalConfig` (formal-language
classifiers). Each checks what spans its sections; the sections check themselves (:mod:`regulargpt.config.sections`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from regulargpt.config.sections import (
    ConfigError,
    DataConfig,
    EvalConfig,
    FormalDataConfig,
    FormalEvalConfig,
    FormalTrainConfig,
    LoggingConfig,
    ModelConfig,
    TrainConfig,
)


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
        window = (self.eval.select_last - 1) * self.eval.select_every
        if window >= self.train.steps:
            raise ConfigError(f"eval.select_last = {self.eval.select_last}, eval.select_every = "
                              f"{self.eval.select_every}: the first checked step would be train.steps - {window} < 1 "
                              f"(train.steps = {self.train.steps}); expected (select_last - 1) x select_every < "
                              f"train.steps")


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
