"""``config.json`` of an exported model: the run's ``model`` section verbatim, and the depth policy as its own field.

    {"model_type": "regulargpt", "regulargpt": {<every ModelConfig field, as the run saved it>},
     "depth_policy": "train",                      # RegularGPT only (null for the dense baselines): the run's own
     "vocab_size": 8000, "hidden_size": 768, ...,  # derived from "regulargpt", for tools that read them
     "auto_map": {...}, "eos_token_id": 2, ...}

The model is whatever :class:`~regulargpt.config.ModelConfig` the ``regulargpt`` object describes, validated as a
run config is (unknown keys and impossible values are errors naming the key): no table of architectures here, so a
new model field or position scheme exports without a change to this package. ``depth_policy`` replaces
``regulargpt.depth_policy`` when it is set; choose another at load time with
``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True, depth_policy="per_position")`` (same weights).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig

from regulargpt.config import ConfigError, ModelConfig, load_config_dict

__all__ = ["RegularGPTConfig"]


class RegularGPTConfig(PreTrainedConfig):
    """The ``transformers`` config of a regulargpt language model; :attr:`model_config` is the model it describes.

    Example::

        cfg = RegularGPTConfig(regulargpt={"architecture": "transformer", "position": "alibi", "n_layers": 2})
        cfg.model_config.position, cfg.num_hidden_layers     # ('alibi', 2)
    """

    model_type = "regulargpt"

    regulargpt: dict[str, Any] | None = None  # the run's ModelConfig fields; None: ModelConfig's defaults
    depth_policy: str | None = None  # RegularGPT: "adaptive", "train" or "per_position"; None: regulargpt's own
    # Derived from `regulargpt` in __post_init__ (whatever config.json holds is replaced), for tools that read them:
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_hidden_layers: int | None = None  # dense: n_layers; RegularGPT: thickness K (distinct layers of weights)
    tie_word_embeddings: bool = False
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        model = self.model_config  # validates: a ConfigError naming the key
        if model.head != "lm":
            raise ConfigError(f"config.json[regulargpt]: model.head {model.head!r}: only language models (head 'lm') "
                              f"export to the Hugging Face format")
        self.vocab_size, self.hidden_size, self.num_attention_heads = model.vocab_size, model.d_model, model.n_heads
        self.num_hidden_layers = model.thickness if model.architecture == "regular_gpt" else model.n_layers
        if model.position == "learned":  # the others read any length: no attribute, so that tools (lm-evaluation-
            self.max_position_embeddings = model.max_positions  # harness) take their own default, not None
        self.tie_word_embeddings = model.tie_embeddings
        super().__post_init__(**kwargs)

    @property
    def model_config(self) -> ModelConfig:
        """The regulargpt model config: ``regulargpt`` with ``depth_policy`` (when set) in place of its own."""
        fields = dict(self.regulargpt or {})
        if self.depth_policy is not None:
            fields["depth_policy"] = self.depth_policy
        return load_config_dict({"model": fields}, source="config.json[regulargpt]").model
