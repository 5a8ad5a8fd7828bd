"""Perplexity at many evaluation lengths: window plans, token accounting, bounded-memory scoring, resumable rows.

The held-out split is one token stream x_0 … x_{n−1}; a *window* of length L is the input x_a … x_{a+L−1} with the
targets x_{a+1} … x_{a+L}, and the model predicts target a+1+p from the inputs at positions 0..p of the window.
Every length scores the same targets x_1 … x_N (N = :func:`plan_tokens`), so lengths differ only in context:

* ``nonoverlapping`` (KERPLE / ALiBi): windows start at 0, L, 2L, …; every target of every window is scored.
  Example: N = 4096, L = 1024 → 4 windows, 4 × 1024 = 4096 tokens; at L = 4096 → 1 window, 4096 tokens.
* ``sliding`` with stride S: the first window (start 0) scores all L targets; each next window ends S targets later
  and scores only its last S targets (the last window ends at N and scores what is left). Every target is scored
  once, with at least L − S inputs before it except in the first window. Example: N = 10, L = 4, S = 2 → windows
  start at 0, 2, 4, 6 and score 4 + 2 + 2 + 2 = 10 targets. S = L is exactly ``nonoverlapping``.

ppl = exp(Σ NLL / N). Sums run in float64 over fp32 per-token losses. Under torchrun/deepspeed (WORLD_SIZE > 1)
rank r scores windows r, r + W, r + 2W, … and the sums and counts are all-reduced over gloo.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from regulargpt.checkpoint import load_model_file
from regulargpt.config import Config, ModelConfig
from regulargpt.data import DataError, TokenSplit, load_manifest, open_split
from regulargpt.errors import UserError

__all__ = [
    "EvalError",
    "Protocol",
    "ResultsFile",
    "RunInfo",
    "WindowPlan",
    "check_compatible",
    "choose_batch_size",
    "distributed_context",
    "estimate_memory",
    "load_run",
    "model_label",
    "open_eval_split",
    "plan_tokens",
    "plan_windows",
    "position_buckets",
    "score_windows",
    "sweep",
    "training_tokenizer_sha",
]

Protocol = Literal["nonoverlapping", "sliding"]
_GIB = float(1 << 30)
_MAX_BATCH = 256

_POSITION_NAMES = {"none": "NoPE", "sinusoidal": "Sinusoidal", "learned": "Learned", "rope": "RoPE",
                   "alibi": "ALiBi", "t5": "T5", "kerple_log": "KERPLE-log", "kerple_power": "KERPLE-power"}


class EvalError(UserError, ValueError):
    """A problem the user can fix (missing run or data, mismatched tokenizer, bad lengths); the message says which."""


# ------------------------------------------------------------------------------------------------ token accounting


def plan_tokens(stream_tokens: int, lengths: Sequence[int], requested: int = 0,
                protocol: Protocol = "nonoverlapping") -> dict[int, int]:
    """Targets scored at each length; 0 where the split is shorter than one window.

    A split of n tokens has n − 1 targets. N = `requested` (or all n − 1) rounded down to a multiple of every
    length that fits, so each length uses whole windows and all lengths score the same N. When the lengths'
    least common multiple exceeds that, N is rounded to the longest length and ``nonoverlapping`` scores
    ⌊N / L⌋·L at each L (the counts then differ slightly and the rows say so); ``sliding`` always scores N.

    >>> plan_tokens(10_000, [512, 1024, 2048])
    {512: 8192, 1024: 8192, 2048: 8192}
    >>> plan_tokens(1000, [64, 2048])
    {64: 960, 2048: 0}
    """
    if any(length < 1 for length in lengths):
        raise EvalError(f"lengths must be integers >= 1, got {list(lengths)}")
    available = max(0, stream_tokens - 1)
    fit = [length for length in lengths if length <= available]
    if not fit:
        return {length: 0 for length in lengths}
    target = min(requested, available) if requested > 0 else available
    longest = max(fit)
    if target < longest:
        raise EvalError(f"--tokens {requested} is less than one window of the longest length {longest}; "
                        f"ask for at least {longest} tokens")
    multiple = math.lcm(*fit)
    n = target // multiple * multiple if multiple <= target else target // longest * longest
    if protocol == "sliding":
        return {length: n if length in fit else 0 for length in lengths}
    return {length: n // length * length if length in fit else 0 for length in lengths}


@dataclass(frozen=True)
class WindowPlan:
    """Window w has inputs stream[starts[w] : starts[w] + length] and scores its positions >= score_from[w]."""

    length: int
    stride: int
    starts: np.ndarray  # (W,) int64
    score_from: np.ndarray  # (W,) int64

    @property
    def tokens(self) -> int:
        return int((self.length - self.score_from).sum())

    def shard(self, rank: int, world: int) -> WindowPlan:
        """The windows rank `rank` of `world` scores: w ≡ rank (mod world)."""
        return WindowPlan(self.length, self.stride, self.starts[rank::world], self.score_from[rank::world])


def plan_windows(tokens: int, length: int, protocol: Protocol, stride: int = 0) -> WindowPlan:
    """Windows that score targets 1..`tokens` once each (see the module docstring).

    `stride` is ignored for ``nonoverlapping`` (it is L); for ``sliding`` 0 means L // 2 (at least 1).

    >>> p = plan_windows(10, 4, "sliding", 2)
    >>> p.starts.tolist(), p.score_from.tolist(), p.tokens
    ([0, 2, 4, 6], [0, 2, 2, 2], 10)
    """
    if length < 1:
        raise EvalError(f"length must be >= 1, got {length}")
    if tokens < length:
        raise EvalError(f"{tokens} tokens do not fill one window of length {length}")
    if protocol == "nonoverlapping":
        starts = np.arange(tokens // length, dtype=np.int64) * length
        return WindowPlan(length, length, starts, np.zeros_like(starts))
    if protocol != "sliding":
        raise EvalError(f"protocol {protocol!r}: expected 'nonoverlapping' or 'sliding'")
    stride = stride or max(1, length // 2)
    if not 1 <= stride <= length:
        raise EvalError(f"--stride {stride}: expected 1 <= stride <= length {length}")
    steps = -(-(tokens - length) // stride)  # windows after the first
    ends = np.minimum(length + stride * np.arange(steps + 1, dtype=np.int64), tokens)  # last target of each window
    scored = np.diff(ends, prepend=0)
    scored[0] = length
    return WindowPlan(length, stride, ends - length, length - scored)


# ----------------------------------------------------------------------------------------------------- memory


def model_label(cfg: ModelConfig) -> str:
    """Display name: ``RegularGPT C4 K4``, ``ALiBi``, ``KERPLE-log``, ``NoPE`` …"""
    if cfg.architecture == "regular_gpt":
        return f"RegularGPT C{cfg.chunk_size} K{cfg.thickness}"
    if cfg.architecture == "transformer":
        return _POSITION_NAMES[cfg.position]
    return cfg.architecture.upper()


def estimate_memory(cfg: ModelConfig, length: int, batch: int) -> int:
    """Bytes one no-grad forward + loss of `batch` windows of `length` needs (an upper-side estimate).

    Per token (fp32): residual, normed input, q/k/v, attention output and FFN hidden (twice, around the activation)
    ≈ (2·ffn_mult + 8)·d values; logits, log-softmax and loss ≈ 3·V. RegularGPT adds its folded band scores
    (~4·H·C). Dense models with an additive bias add their query-chunked score block (``attention_memory_mb``,
    which shrinks its chunk as the batch grows, but holds at least one query row: 3·B·H·L fp32); bias-free dense
    attention uses the fused kernel (no L×L block). Plus the weights.
    """
    per_token = cfg.d_model * (2 * cfg.ffn_mult + 8) + 3 * cfg.vocab_size
    fixed = 0
    if cfg.architecture == "regular_gpt":
        per_token += 4 * cfg.n_heads * cfg.chunk_size
    elif cfg.position in ("alibi", "t5", "kerple_log", "kerple_power"):
        block = 12 * batch * cfg.n_heads * length  # one query row of scores, probabilities and bias
        fixed = max(min(cfg.attention_memory_mb << 20, block * length), block)
    weights = 4 * _num_parameters(cfg)
    return 4 * per_token * length * batch + fixed + weights


def _num_parameters(cfg: ModelConfig) -> int:
    d, f, v = cfg.d_model, cfg.ffn_mult, cfg.vocab_size
    layer = 4 * d * d + 2 * f * d * d + (f + 1) * d + 4 * d
    layers = cfg.thickness if cfg.architecture == "regular_gpt" else cfg.n_layers
    return layers * layer + (1 if cfg.tie_embeddings else 2) * v * d


def choose_batch_size(cfg: ModelConfig, length: int, memory_gb: float, windows: int) -> int:
    """Largest batch (≤ windows, ≤ 256) whose :func:`estimate_memory` stays within `memory_gb`; 0 if even 1 does not."""
    budget = memory_gb * _GIB
    if estimate_memory(cfg, length, 1) > budget:
        return 0
    lo, hi = 1, max(1, min(windows, _MAX_BATCH))
    while lo < hi:  # largest b with estimate(b) <= budget
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if estimate_memory(cfg, length, mid) <= budget else (lo, mid - 1)
    return lo


# ----------------------------------------------------------------------------------------------------- scoring


def position_buckets(nll_sum: np.ndarray, counts: np.ndarray) -> list[dict[str, float | int]]:
    """Mean NLL over window positions in octaves [0,1), [1,2), [2,4), [4,8), …; empty buckets are left out.

    Octave edges are shared by every length, so curves at different lengths overlay, and the training length
    (a power of two here) is a bucket edge.
    """
    out: list[dict[str, float | int]] = []
    start, end = 0, 1
    while start < len(nll_sum):
        stop = min(end, len(nll_sum))
        n = int(counts[start:stop].sum())
        if n:
            out.append({"start": start, "end": stop, "tokens": n, "nll": float(nll_sum[start:stop].sum() / n)})
        start, end = end, end * 2
    return out


@torch.no_grad()
def score_windows(model: nn.Module, stream: np.ndarray, plan: WindowPlan, batch_size: int,
                  device: torch.device | str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Score the plan's windows → (NLL sum per window position (L,) float64, scored tokens per position (L,) int64).

    `model` maps (B, L) token ids to (B, L, V) logits and must be in eval mode.
    """
    length = plan.length
    nll_sum = torch.zeros(length, dtype=torch.float64)
    counts = torch.zeros(length, dtype=torch.int64)
    positions = torch.arange(length)
    for i in range(0, len(plan.starts), batch_size):
        starts = plan.starts[i:i + batch_size]
        block = np.stack([np.asarray(stream[a:a + length + 1], dtype=np.int64) for a in starts])  # (B, L+1)
        ids = torch.from_numpy(block).to(device)
        logits = model(ids[:, :-1])  # (B, L, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
        nll = nll.view(len(starts), length).cpu()  # (B, L)
        scored = positions[None, :] >= torch.from_numpy(plan.score_from[i:i + batch_size])[:, None]  # (B, L)
        nll_sum += torch.where(scored, nll.double(), 0.0).sum(0)
        counts += scored.sum(0)
    return nll_sum.numpy(), counts.numpy()


def all_reduce_sums(*arrays: np.ndarray) -> list[np.ndarray]:
    """Sum numpy arrays over the default process group (gloo); identity without one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(arrays)
    out = []
    for a in arrays:
        t = torch.from_numpy(np.ascontiguousarray(a))
        dist.all_reduce(t)
        out.append(t.numpy())
    return out


# ------------------------------------------------------------------------------------------------- runs and data


@dataclass
class RunInfo:
    """One trained model to evaluate: its key (the run path as given), config, model and what the tables show."""

    run: str
    path: Path
    cfg: Config
    model: nn.Module
    meta: dict[str, Any]

    @property
    def label(self) -> str:
        return model_label(self.cfg.model)

    @property
    def seed(self) -> int:
        return self.cfg.train.seed


def load_run(run: str | Path, device: torch.device | str = "cpu") -> RunInfo:
    """A run directory holding model.pt, or a model.pt path → RunInfo (model in eval mode on `device`)."""
    path = Path(run)
    model_path = path / "model.pt" if path.is_dir() else path
    if not model_path.is_file():
        where = f"run directory {path} has no model.pt" if path.is_dir() else f"{path} does not exist"
        raise EvalError(f"{where}; train it with `python launch/pretrain.py --config FILE --run-dir {path}` first")
    cfg, model, meta = load_model_file(model_path, map_location=device)
    if cfg.model.head != "lm":
        raise EvalError(f"{model_path}: head {cfg.model.head!r} is not a language model (perplexity needs head 'lm')")
    return RunInfo(str(run).rstrip("/"), model_path, cfg, model.to(device).eval(), meta)


def _find_key(obj: Any, key: str) -> Any:
    """First value stored under `key` anywhere in nested dicts (depth-first), else None."""
    if isinstance(obj, dict):
        if isinstance(obj.get(key), str):
            return obj[key]
        for value in obj.values():
            found = _find_key(value, key)
            if found is not None:
                return found
    return None


def training_tokenizer_sha(info: RunInfo) -> tuple[str, str] | None:
    """(sha256 of the tokenizer the run trained with, where it was found), if the run recorded it.

    Looked up in model.pt's meta (``tokenizer_sha256``, or a data manifest's ``tokenizer.sha256``), then the
    ``trainer_state.json`` of the checkpoint model.pt was exported from (its data fingerprint), then a
    ``data_manifest.json`` next to model.pt, then the manifest of the run's ``data.path`` if that folder exists.
    """
    meta_sha = _find_key(info.meta, "tokenizer_sha256")
    if meta_sha is None and isinstance(info.meta.get("data_manifest"), dict):
        meta_sha = _find_key(info.meta["data_manifest"].get("tokenizer", {}), "sha256")
    if meta_sha:
        return meta_sha, f"{info.path} meta"
    state = info.path.parent / str(info.meta.get("checkpoint", "")) / "trainer_state.json"
    if info.meta.get("checkpoint") and state.is_file():
        sha = _find_key(json.loads(state.read_text()), "tokenizer_sha256")
        if sha:
            return sha, str(state)
    saved = info.path.parent / "data_manifest.json"
    if saved.is_file():
        sha = _find_key(json.loads(saved.read_text()).get("tokenizer", {}), "sha256")
        if sha:
            return sha, str(saved)
    if info.cfg.data.path and (Path(info.cfg.data.path) / "manifest.json").is_file():
        try:
            return load_manifest(info.cfg.data.path)["tokenizer"]["sha256"], f"{info.cfg.data.path}/manifest.json"
        except DataError:
            return None
    return None


def open_eval_split(data_dir: str | Path, split: str) -> TokenSplit:
    """Open the held-out split; EvalError (not a traceback) when the folder or split is missing or corrupt."""
    try:
        tokens = open_split(data_dir, split)
        if not tokens.tokenizer_path.is_file():
            raise EvalError(f"data folder {data_dir} has no tokenizer file {tokens.tokenizer_path.name} (listed in its "
                            f"manifest.json); re-run data_prep/prepare.py for it")
        return tokens
    except DataError as err:
        raise EvalError(str(err)) from None


def check_compatible(info: RunInfo, split: TokenSplit) -> None:
    """The run's vocabulary and tokenizer must be the data folder's; EvalError naming both otherwise."""
    vocab = info.cfg.model.vocab_size
    if vocab != split.vocab_size:
        raise EvalError(f"{info.run}: model vocab_size {vocab} does not match data folder {split.data_dir} "
                        f"(vocab_size {split.vocab_size}); evaluate on data tokenised with the run's tokenizer")
    found = training_tokenizer_sha(info)
    data_sha = split.manifest["tokenizer"]["sha256"]
    if found is not None and found[0] != data_sha:
        raise EvalError(f"{info.run}: trained with tokenizer sha256 {found[0][:12]}… ({found[1]}) but data folder "
                        f"{split.data_dir} was tokenised with {data_sha[:12]}…; prepare the evaluation data with "
                        f"`data_prep/prepare.py --tokenizer <the run's tokenizer.model>`")
    try:
        split.check_token_range(vocab)
    except DataError as err:
        raise EvalError(str(err)) from None


# ------------------------------------------------------------------------------------------------ results file


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a result: (run, dataset, split, length, protocol, stride, tokens)."""
    return tuple(row.get(k) for k in ("run", "dataset", "split", "length", "protocol", "stride", "tokens"))


class ResultsFile:
    """Append-only JSONL of result rows. Each append is one line, flushed and fsynced; a partial last line left by
    a crash is cut off when the file is opened, so the next append starts on a clean line."""

    def __init__(self, path: str | Path, repair: bool = True) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = []
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1  # bytes up to the last complete line
        for line in data[:keep].splitlines():
            if line.strip():
                try:
                    self.rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line torn by a crash in the middle of the file cannot happen; ignore if it does
        if keep != len(data) and repair:
            with open(self.path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())

    def latest(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The last row written for every key."""
        return {row_key(r): r for r in self.rows}

    def append(self, row: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write((json.dumps(row, sort_keys=True) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)


def is_done(row: dict[str, Any] | None, memory_gb: float) -> bool:
    """A stored row counts as done unless it was skipped for memory under a smaller budget than now."""
    if row is None:
        return False
    if row.get("skipped") and row.get("skipped_for") == "memory":
        return float(row.get("memory_gb", 0.0)) >= memory_gb
    return True


def result_row(info: RunInfo, dataset: str, split: str, plan: WindowPlan, protocol: Protocol,
               nll_sum: np.ndarray, counts: np.ndarray, seconds: float, **extra: Any) -> dict[str, Any]:
    """A finished row: token-weighted mean NLL, ppl = exp(NLL), per-position octave buckets."""
    tokens = int(counts.sum())
    nll = float(nll_sum.sum() / tokens)
    return {**_row_base(info, dataset, split, plan.length, protocol, plan.stride, tokens),
            "windows": len(plan.starts), "nll": nll, "ppl": math.exp(nll),
            "per_position": position_buckets(nll_sum, counts), "seconds": round(seconds, 3), **extra}


def skipped_row(info: RunInfo, dataset: str, split: str, length: int, protocol: Protocol, stride: int, tokens: int,
                reason: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {**_row_base(info, dataset, split, length, protocol, stride, tokens), "nll": None, "ppl": None,
            "skipped": reason, "skipped_for": kind, "seconds": 0.0, **extra}


def _row_base(info: RunInfo, dataset: str, split: str, length: int, protocol: Protocol, stride: int,
              tokens: int) -> dict[str, Any]:
    return {"run": info.run, "model": info.label, "seed": info.seed, "dataset": dataset, "split": split,
            "length": length, "protocol": protocol, "stride": stride, "tokens": tokens,
            "train_length": info.cfg.data.seq_len, "params": sum(p.numel() for p in info.model.parameters())}


# ------------------------------------------------------------------------------------------------------- sweep


def distributed_context() -> tuple[int, int]:
    """(rank, world size). Under torchrun/deepspeed (WORLD_SIZE > 1 in the environment) joins a gloo group."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and dist.is_available() and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def sweep(runs: Sequence[str | Path], data_dir: str | Path, split: str, lengths: Sequence[int], out_dir: str | Path,
          protocol: Protocol = "nonoverlapping", stride: int = 0, tokens: int = 0, memory_gb: float = 4.0,
          batch_size: int = 0, device: torch.device | str = "cpu", progress: bool = True) -> list[dict[str, Any]]:
    """Evaluate every (run, length) not already in ``out_dir/results.jsonl``; returns this sweep's rows.

    Every rank computes its share of the windows; rank 0 appends the reduced rows. Rows record the exact token
    count, the stride, the batch size and the memory budget. A length that cannot run gets a ``skipped`` row.
    """
    from tqdm.auto import tqdm

    if not lengths or any(length < 1 for length in lengths):
        raise EvalError(f"--lengths must be integers >= 1, got {list(lengths)}")
    if protocol == "sliding" and stride and stride > min(lengths):
        raise EvalError(f"--stride {stride} exceeds the shortest length {min(lengths)}; a window cannot advance past "
                        f"its own end (use a stride <= every length, or leave it out for L/2)")
    rank, world = distributed_context()
    data = open_eval_split(data_dir, split)
    dataset = Path(data_dir).resolve().name
    counts = plan_tokens(len(data), lengths, tokens, protocol)
    for run in runs:  # fail on a bad run before spending time on the others
        check_compatible(load_run(run), data)
    results = ResultsFile(Path(out_dir) / "results.jsonl", repair=rank == 0)
    done = results.latest()
    _barrier()  # every rank has read the file before rank 0 appends to it
    stride_of = {length: length if protocol == "nonoverlapping" else (stride or max(1, length // 2)) for length in lengths}
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(runs) * len(lengths), desc="(run, length)", disable=rank != 0 or not progress)
    for run in runs:
        info: RunInfo | None = None
        for length in lengths:
            key = (str(run).rstrip("/"), dataset, split, length, protocol, stride_of[length], counts[length])
            if is_done(done.get(key), memory_gb):
                bar.update()
                continue
            info = info or load_run(run, device)
            row = _evaluate_length(info, data, dataset, split, length, protocol, stride_of[length], counts[length],
                                   memory_gb, batch_size, device, rank, world)
            if rank == 0:
                results.append(row)
                bar.write(_describe(row))
            rows.append(row)
            bar.update()
        del info
    bar.close()
    _barrier()
    return rows


def _evaluate_length(info: RunInfo, data: TokenSplit, dataset: str, split: str, length: int, protocol: Protocol,
                     stride: int, n: int, memory_gb: float, batch_size: int, device: torch.device | str, rank: int,
                     world: int) -> dict[str, Any]:
    cfg = info.cfg.model
    common = {"memory_gb": memory_gb, "world_size": world}
    if n == 0:
        return skipped_row(info, dataset, split, length, protocol, stride, 0,
                           f"the {split} split has {len(data)} tokens, fewer than one window of {length} + 1", "data",
                           **common)
    if cfg.position == "learned" and length > cfg.max_positions:
        return skipped_row(info, dataset, split, length, protocol, stride, n,
                           f"learned absolute positions end at max_positions={cfg.max_positions}", "positions", **common)
    plan = plan_windows(n, length, protocol, stride)
    per_rank = -(-len(plan.starts) // world)
    fits = choose_batch_size(cfg, length, memory_gb, per_rank)
    if fits == 0:
        need = estimate_memory(cfg, length, 1) / _GIB
        return skipped_row(info, dataset, split, length, protocol, stride, n,
                           f"needs ~{need:.1f} GiB for one window (budget {memory_gb:g} GiB)", "memory", **common)
    batch = min(batch_size, fits) if batch_size else fits
    t0 = time.perf_counter()
    nll_sum, counts = score_windows(info.model, data.tokens, plan.shard(rank, world), batch, device)
    nll_sum, counts = all_reduce_sums(nll_sum, counts)
    return result_row(info, dataset, split, plan, protocol, nll_sum, counts, time.perf_counter() - t0,
                      batch_size=batch, **common)


def _describe(row: dict[str, Any]) -> str:
    head = f"{row['model']} seed {row['seed']} · {row['dataset']} L={row['length']}"
    if row.get("skipped"):
        return f"{head}: skipped ({row['skipped']})"
    return (f"{head}: ppl {row['ppl']:.3f} over {row['tokens']} tokens in {row['windows']} windows "
            f"({row['protocol']}, stride {row['stride']}, batch {row['batch_size']}, {row['seconds']:.1f} s)")
