"""DeepSpeed engine setup: the DeepSpeed config built from our :class:`Config`, the client optimizer and LR schedule,
activation checkpointing applied from outside the model code, and the CPU shm-op skip; the process environment
(every launcher's ranks) is :mod:`regulargpt.train.process_env`, re-exported here.

One engine serves every ZeRO stage (0–3) and precision (fp32, bf16; fp16 on CUDA only). The optimizer is
``torch.optim.AdamW`` handed to DeepSpeed as a client optimizer, so no DeepSpeed op is JIT-compiled on CPU; the LR
schedule is a ``torch.optim.lr_scheduler.LambdaLR`` that DeepSpeed steps after every optimizer step::

    factor(s) = (s + 1) / W                                          s < W     (linear warmup, W = round(f·steps))
              = r + (1 − r) · ½ · (1 + cos(π · (s − W) / (steps − 1 − W)))  s ≥ W  (cosine: r = min_lr_ratio at
                                                                                    the last step, steps − 1)
              = 1                                                   s ≥ W     (schedule "constant")

(an extended run re-plans it from the step it was extended at: :func:`lr_factor`)

Example (one process, after :func:`prepare_process_env`)::

    engine, scheduler, names, optimizer = build_engine(cfg, model, world_size=1)
    loss = loss_fn(engine(inputs), targets); engine.backward(loss); engine.step()

Skipped steps: the client optimizer is :class:`GuardedAdamW`, whose ``step`` — the call every DeepSpeed wrapper (ZeRO
1–3, the bf16/fp16 optimizers) makes last, after it has computed the global gradient norm — reads the loop's
device flags (one host read per optimizer step) and does nothing for a step the loop marked bad or whose global
norm is not finite. Weights and optimizer state then stay
exactly as they were (DeepSpeed still zeroes the gradients). Most DeepSpeed wrappers also skip such a step on their
own (``OVERFLOW! Skipping step``); the guard makes it hold for every stage and precision, ZeRO-0 fp32 included,
where DeepSpeed calls the torch optimizer directly.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from regulargpt.config import Config, merge_dicts
from regulargpt.errors import TrainError
from regulargpt.train.process_env import prepare_process_env

__all__ = [
    "TrainError",
    "prepare_process_env",
    "skip_shm_build",
    "deepspeed_config",
    "check_deepspeed_config",
    "lr_factor",
    "param_groups",
    "apply_activation_checkpointing",
    "GuardedAdamW",
    "adamw_kernel",
    "build_engine",
    "compile_engine",
    "check_precision",
    "check_compile",
]


# -------------------------------------------------------------------------------------------- shm comm op


def _shm_op_available() -> bool:
    """True when DeepSpeed's CPU shared-memory comm op is precompiled or already in the JIT cache."""
    try:
        from deepspeed.git_version_info import installed_ops

        if installed_ops.get("deepspeed_shm_comm"):
            return True
    except ImportError:
        return False
    from torch.utils.cpp_extension import get_default_build_root  # TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions

    return any(Path(get_default_build_root()).glob("*/deepspeed_shm_comm/*.so"))


def skip_shm_build(force: bool = False) -> bool:
    """On CPU, stop DeepSpeed from JIT-compiling its shm comm op (25–28 s with g++) unless it is already built.

    The op only accelerates DeepSpeed's *inference* all-reduce; training collectives go through gloo either way, so
    skipping it changes nothing in training (losses are identical). ``REGULARGPT_BUILD_SHM=1`` keeps the build.
    Must run before ``deepspeed.init_distributed``. Returns True when the build was skipped.

    (``import deepspeed.comm.torch as m`` would hand back the *torch* package, hence ``sys.modules``.)
    """
    if os.environ.get("DS_ACCELERATOR") != "cpu" or os.environ.get("REGULARGPT_BUILD_SHM") == "1":
        return False
    if not force and _shm_op_available():
        return False
    importlib.import_module("deepspeed.comm.torch")
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return True


# ------------------------------------------------------------------------------------------- deepspeed config


COMPILE_BACKEND_ENV = "REGULARGPT_COMPILE_BACKEND"  # e.g. aot_eager: dynamo + AOT autograd without inductor's codegen
BUCKET_ELEMENTS = 50_000_000  # 100 MB of bf16 gradients per ZeRO reduce / all-gather bucket


def _zero_section(stage: int) -> dict[str, Any]:
    """``zero_optimization`` for `stage`. Stages 1–3 reduce gradients in buckets of ``BUCKET_ELEMENTS`` while the
    backward pass goes on (``overlap_comm``, into one ``contiguous_gradients`` buffer); DeepSpeed's default bucket
    (5e8 elements) is larger than the base model (~124 M parameters), so nothing would overlap. Stage 3 prefetches
    the next layers' parameters in buckets of the same size. Exact: a bucket sums the same values over the ranks in
    the same order, whatever its size (tests/test_host_syncs.py compares two-process losses with and without)."""
    if stage == 0:
        return {"stage": 0}
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": BUCKET_ELEMENTS}
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = BUCKET_ELEMENTS
    else:
        zero["allgather_bucket_size"] = BUCKET_ELEMENTS
    return zero


def deepspeed_config(cfg: Config, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config for `cfg`: batch sizes, ZeRO stage (:func:`_zero_section`), precision, clipping;
    ``cfg.deepspeed`` merged last (e.g. ``--set deepspeed.zero_optimization.overlap_comm=false``).

    >>> deepspeed_config(load_config("configs/tiny/regular_gpt.json"), 2)["train_batch_size"]  # doctest: +SKIP
    32
    """
    t = cfg.train
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": t.batch_size,
        "gradient_accumulation_steps": t.grad_accum,
        "train_batch_size": t.batch_size * t.grad_accum * world_size,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": _zero_section(t.zero_stage),
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16", "initial_scale_power": 16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,  # we print our own progress
        "wall_clock_breakdown": False,
    }
    return merge_dicts(ds, cfg.deepspeed)


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def check_deepspeed_config(cfg: Config, world_size: int) -> None:
    """Run DeepSpeed's own validation of the merged config now, before anything is written: a pass-through value it
    rejects becomes a TrainError naming the key and value. Nothing to check (and no import) without ``deepspeed.*``.

    e.g. ``--set deepspeed.zero_optimization.overlap_comm=maybe`` → ``deepspeed.zero_optimization.overlap_comm:
    'maybe' is not accepted by DeepSpeed: Input should be a valid boolean, …``.
    """
    if not cfg.deepspeed:
        return
    from deepspeed.runtime.config import DeepSpeedConfig

    ds = deepspeed_config(cfg, world_size)
    ds.pop("train_batch_size")  # derived from the world size, which DeepSpeedConfig cannot know before init_distributed
    try:
        DeepSpeedConfig(ds)
    except (ValueError, AssertionError, TypeError, KeyError) as err:
        user = _leaves(cfg.deepspeed)
        details = err.errors() if hasattr(err, "errors") else []  # pydantic: [{"loc": (...), "msg": ...}, ...]
        for item in details:
            loc = ".".join(str(p) for p in item.get("loc", ()))
            path = next((k for k in user if k == loc or k.endswith("." + loc)), None)
            if path is not None:
                raise TrainError(f"deepspeed.{path}: {user[path]!r} is not accepted by DeepSpeed: "
                                 f"{item.get('msg', err)}") from None
        message = " ".join(str(err).split())
        raise TrainError(f"the deepspeed.* settings {json.dumps(cfg.deepspeed)} are not accepted by DeepSpeed: "
                         f"{message[:300]}") from None


# ------------------------------------------------------------------------------------------ optimizer + schedule


def lr_factor(step: int, cfg: Config) -> float:
    """Multiplier of ``train.lr`` for optimizer step `step` (0-based, so the last step is ``train.steps − 1``).

    The steps form segments ``[0, e1), [e1, e2), …, [ek, steps)``, split at ``train.extended_from`` = [e1 … ek]
    (one segment unless the run was extended with ``--extend-to``). In a segment of n steps, with k = step − start,
    W = round(warmup_fraction · n) and r = min_lr_ratio::

        factor = f0 + (1 − f0) · (k + 1) / W                       k < W   (warmup; f0 = 0 in the first segment,
                                                                             r in later ones: from the minimum)
               = r + (1 − r) · ½ · (1 + cos(π · (k − W) / (n − 1 − W)))   k ≥ W  (cosine: 1 at k = W, r at k = n − 1)
               = 1                                                  k ≥ W   (schedule "constant"; later segments
                                                                             of a constant schedule: 1 throughout)

    So the first post-warmup step runs at the peak and the last step of every segment at exactly ``min_lr_ratio``
    (a segment with a single post-warmup step stays at the peak).
    """
    t = cfg.train
    start = max((e for e in t.extended_from if e <= step), default=0)
    end = min((e for e in t.extended_from if e > step), default=t.steps)
    n, k, first = end - start, step - start, start == 0
    if t.schedule == "constant" and not first:
        return 1.0
    warmup = round(t.warmup_fraction * n)
    if k < warmup:
        floor = 0.0 if first else t.min_lr_ratio
        return floor + (1.0 - floor) * (k + 1) / warmup
    if t.schedule == "constant":
        return 1.0
    progress = min(1.0, (k - warmup) / max(1, n - 1 - warmup))
    return t.min_lr_ratio + (1.0 - t.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, weight_decay: float) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """AdamW groups (decay on ≥2-D weights only) and the parameter names of each group, in optimizer order.

    The names are stored with every checkpoint: they map a ZeRO-0 optimizer's fp32 master copies back to modules.
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and weight_decay > 0 else no_decay).append((name, p))
    groups, names = [], []
    for members, wd in ((decay, weight_decay), (no_decay, 0.0)):
        if members:
            groups.append({"params": [p for _, p in members], "weight_decay": wd})
            names.append([n for n, _ in members])
    return groups, names


# ------------------------------------------------------------------------------------- activation checkpointing


def _checkpointed_forward(original: Any, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return original(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Recompute every Transformer layer application in the backward pass instead of storing its activations.

    Each ``TransformerLayer`` instance gets an instance-level ``forward`` that runs the original under
    ``torch.utils.checkpoint`` (non-reentrant, so closures over parameters — RegularGPT's window scalars and pad
    keys — receive gradients). RegularGPT applies its K shared sub-layers at every depth step, so every one of the
    K·L applications is checkpointed separately. Module names and the state dict are unchanged; the model code is
    not touched. Returns the number of layer modules wrapped.
    """
    from regulargpt.model.layers import TransformerLayer

    wrapped = 0
    for module in model.modules():
        if isinstance(module, TransformerLayer):
            module.forward = functools.partial(_checkpointed_forward, module.forward)  # bound original
            wrapped += 1
    return wrapped


# ----------------------------------------------------------------------------------------------------- engine


class GuardedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose update can be discarded, decided with one host read per optimizer step.

    Before the step the trainer sets ``flags``, a 1-D tensor on the training device whose element 0 is non-zero for
    a step to skip (the other elements are whatever else it wants on the host this step). ``step`` reads them in one
    transfer together with whether ``wrapper`` (the DeepSpeed optimizer around it, if any) computed a non-finite
    global gradient norm — computed before it calls this ``step`` — into ``read`` (a list of floats, the norm's
    verdict last). With element 0 non-zero or a non-finite norm it changes nothing and sets ``fired``. Plain AdamW
    otherwise; its state dict is AdamW's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flags: torch.Tensor | None = None
        self.read: list[float] | None = None
        self.fired, self.wrapper = False, None

    def step(self, closure: Any = None) -> Any:
        flags = self.flags if self.flags is not None else torch.zeros(1)
        norm = getattr(self.wrapper, "_global_grad_norm", None)
        parts = [flags.float().reshape(-1)]
        if torch.is_tensor(norm):
            parts.append((~torch.isfinite(norm.float().reshape(1))).float().to(flags.device))
        self.read = torch.cat(parts).tolist()  # the one host read (device sync) of this optimizer step
        norm_bad = self.read[-1] > 0 if torch.is_tensor(norm) else norm is not None and not math.isfinite(norm)
        if self.read[0] > 0 or norm_bad:
            self.fired = True
            return None
        return super().step(closure)


def adamw_kernel(device: torch.device) -> dict[str, bool]:
    """AdamW's implementation for parameters on `device`: the multi-tensor (``foreach``) kernels on CUDA, a few
    launches per step for all tensors instead of ~10 per tensor; today's single-tensor loop on CPU. The two give the
    same update bit for bit (tests/test_host_syncs.py, on CPU, where torch has both); ``fused`` was left out: it
    differs from them in the last bit of fp32 (5.96e-8 after 5 steps, same test setup). Under ZeRO 1–3 DeepSpeed
    hands the optimizer one flat partition per parameter group, so this matters most for ZeRO-0."""
    return {"foreach": device.type == "cuda"}


def check_precision(cfg: Config) -> None:
    """TrainError unless this machine can train at ``train.precision``: fp16 needs CUDA (fp16 matmuls on a CPU run at
    ~2.5 GFLOP/s); fp32 and bf16 run everywhere."""
    if cfg.train.precision == "fp16" and not torch.cuda.is_available():
        raise TrainError("train.precision='fp16' needs a CUDA GPU (fp16 matmuls on this CPU run at ~2.5 GFLOP/s); "
                         "use --set train.precision=bf16 or fp32")


# The first torch release under which train.compile + ZeRO-3 + bf16 matched eager (issue 39: torch 2.11 gave the
# gradient norm 3.5069 against eager's 3.6360 on the same seeded step; eager 2.11 and both modes on 2.13 agree).
COMPILE_ZERO3_BF16_TORCH = (2, 13)


def torch_release(version: str = torch.__version__) -> tuple[int, int]:
    """(major, minor) of a torch version string: "2.11.0+cu130" → (2, 11), "2.13.0.dev20260101" → (2, 13)."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def check_compile(cfg: Config, version: str | None = None) -> None:
    """TrainError for ``train.compile`` with ZeRO-3 and bf16 on torch older than 2.13: on torch 2.11 that
    combination trained with silently wrong gradients (the cause is not found, so the release is the guard).
    `version`: torch's, by default the running one."""
    t, version = cfg.train, version or torch.__version__
    if t.compile and t.zero_stage == 3 and t.precision == "bf16" and torch_release(version) < COMPILE_ZERO3_BF16_TORCH:
        need = ".".join(map(str, COMPILE_ZERO3_BF16_TORCH))
        raise TrainError(f"train.compile=true with train.zero_stage=3 and train.precision=bf16 gives wrong gradients "
                         f"on torch {version} (the gradient norm differed from eager on torch 2.11; torch >= {need} "
                         f"agrees): set train.compile=false, or train.zero_stage to 0-2, or use torch >= {need}")


def build_engine(cfg: Config, model: nn.Module, world_size: int) -> tuple[Any, Any, list[list[str]], GuardedAdamW]:
    """deepspeed.initialize with our optimizer and schedule → (engine, scheduler, param names, the torch optimizer).
    Call :func:`check_precision` and :func:`check_compile` first (``train`` does, before it opens the data)."""
    import deepspeed

    if cfg.train.activation_checkpointing:
        apply_activation_checkpointing(model)
    groups, names = param_groups(model, cfg.train.weight_decay)
    t = cfg.train
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    optimizer = GuardedAdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay,
                             **adamw_kernel(device))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(cfg, world_size),
        dist_init_required=False,
    )
    if ds_optimizer is not optimizer:
        optimizer.wrapper = ds_optimizer
    if t.compile:
        compile_engine(engine, model, t.zero_stage)
    return engine, ds_scheduler, names, optimizer


def compile_engine(engine: Any, model: nn.Module, zero_stage: int) -> list[str]:
    """``train.compile``: DeepSpeed's ``engine.compile()``, i.e. ``nn.Module.compile`` of the wrapped model in place
    (parameter names and state dict unchanged); ``REGULARGPT_COMPILE_BACKEND`` picks the backend (the tests:
    ``aot_eager``). Returns the names of the parameters registered for ZeRO-3 (below; [] under ZeRO 0–2).

    ZeRO-3 gathers a partitioned parameter in two ways: a module's forward pre-hook gathers the module's own
    parameters, and reading any other parameter while a forward runs gathers it on the spot and registers it as an
    *external parameter* of the module running (``ZeROOrderedDict.__getitem__``). Compiled code skips the second
    way (the getter returns the parameter as it is while dynamo traces), so a parameter read outside its own
    module's forward reaches the compiled graph as its empty partition: RegularGPT's pad vector ``stack.pad``,
    read by ``RegularGPTStack.pad_states`` from ``RegularGPT.forward`` (the stack's own forward never runs), gave
    ``layer_norm`` a (1, 1, 0) input. So before compiling, the parameters that a module holds itself while also
    having submodules (the containers: ``stack.pad`` and each sub-layer's window scalars ``rel_bias``, d + K·H·C
    numbers in all) are registered as external parameters of the whole model: its pre-hook, which runs eagerly
    (DeepSpeed disables the compiler over its hooks), gathers them before any compiled code reads them.

    DeepSpeed's hooks still split the compiled forward at every module (docs/PERFORMANCE.md, "train.compile under
    DeepSpeed"), so under ZeRO-3 compiling fuses little; DeepCompile (``deepspeed.compile.deepcompile``, CUDA
    only) is DeepSpeed's answer to that and is not used here.
    """
    registered: list[str] = []
    if zero_stage == 3:
        from deepspeed.runtime.zero.partition_parameters import register_external_parameter

        for module_name, module in model.named_modules():
            if next(module.children(), None) is None:
                continue
            for name, param in module.named_parameters(recurse=False):
                register_external_parameter(model, param)
                registered.append(f"{module_name}.{name}" if module_name else name)
    backend = os.environ.get(COMPILE_BACKEND_ENV)
    engine.compile(**({"backend": backend} if backend else {}))
    return registered
