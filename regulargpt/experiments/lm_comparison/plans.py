"""The CPU-scale language-model studies as data: which (dataset, variant, seed) a study trains, with which overrides,
and at which lengths it is scored. ``STUDIES`` holds v1 (results/lm_cpu, superseded), v2 (results/lm_cpu_v2) and
v2-t256; ``DEMO`` is `make demo`'s small version. Paths are relative to the checkout (``ROOT``), whose configs/,
data_prep/, launch/ and eval/ the stages run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DATASETS", "DEMO", "FULL", "MODELS", "ROOT", "STUDIES", "V2", "V2_T256", "VOCAB", "Plan", "Variant",
           "rel_path", "train_overrides"]

ROOT = Path(__file__).resolve().parents[3]  # the checkout: regulargpt/experiments/lm_comparison/plans.py

MODELS = ("regular_gpt", "alibi", "t5", "kerple_log", "kerple_power", "rope", "nope")  # configs/tiny/<name>.json
DATASETS = ("python-stdlib", "debian-prose", "debian-code", "debian-latex")
VOCAB = 2048


@dataclass(frozen=True)
class Variant:
    """One trained row of a study: configs/tiny/<config>.json with `sets` overrides, run as OUT/runs/<dataset>/
    <name>-seed<k>. `depth_policies`: extra evaluation-time depth policies its weights are also scored with;
    `datasets`: where it is trained (empty = every dataset of the plan); `seeds`: which of the plan's seeds it is
    trained with (empty = all of them), e.g. an ablation row with seeds=(0,) beside 3-seed headline rows."""

    name: str
    config: str
    sets: tuple[str, ...] = ()
    depth_policies: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()


@dataclass
class Plan:
    """What one invocation runs. FULL is the first comparison, V2 the committed study, DEMO the `make demo` version."""

    out: Path
    datasets: tuple[str, ...]
    models: tuple[Variant, ...]
    seeds: dict[str, tuple[int, ...]]
    steps: int
    batch_size: int
    multiples: int  # evaluate lengths train_length · 2^i up to train_length · multiples
    eval_tokens: int
    max_bytes: int = 4_000_000
    data_root: Path = field(default_factory=lambda: ROOT / "data" / "lm_cpu")
    sliding_check: tuple[str, ...] = ()  # variants also scored with the sliding protocol (stride 32), seed 0
    sliding_lengths: tuple[int, ...] = (64, 256, 1024)
    train_length: int = 64  # data.seq_len of every training run
    superseded_by: str = ""  # a later study that replaces this one (said at the top of its README)

    @property
    def lengths(self) -> list[int]:
        return [self.train_length << i for i in range(self.multiples.bit_length()) if 1 << i <= self.multiples]

    @property
    def train_tokens(self) -> int:
        return self.steps * self.batch_size * self.train_length

    @property
    def is_ablation(self) -> bool:
        """A study with RegularGPT variants scored under several depth policies (v2)."""
        return any(m.depth_policies for m in self.models)

    def trainings(self) -> list[tuple[str, Variant, int]]:
        """(dataset, variant, seed), seed-major within each dataset so that every row gets its first seed first."""
        return [(d, m, s) for d in self.datasets for s in self.seeds[d] for m in self.models
                if (not m.datasets or d in m.datasets) and (not m.seeds or s in m.seeds)]

    def seed_summary(self) -> str:
        """Which rows get which seeds, e.g. 'python-stdlib: regular_gpt, alibi 3 seeds; rg_pad_mask 1 seed'."""
        parts = []
        for d in self.datasets:
            counts: dict[int, list[str]] = {}
            for m in self.models:
                n = len({s for dd, mm, s in self.trainings() if dd == d and mm is m})
                if n:
                    counts.setdefault(n, []).append(m.name)
            parts.append(f"{d}: " + "; ".join(f"{', '.join(names)} {n} seed{'s' if n > 1 else ''}"
                                             for n, names in sorted(counts.items(), reverse=True)))
        return " · ".join(parts)

    def run_dir(self, dataset: str, model: Variant, seed: int) -> Path:
        return self.out / "runs" / dataset / f"{model.name}-seed{seed}"


def _plain(*names: str) -> tuple[Variant, ...]:
    return tuple(Variant(n, n) for n in names)


FULL = Plan(out=ROOT / "results" / "lm_cpu", datasets=DATASETS, models=_plain(*MODELS),
            seeds={"python-stdlib": (0, 1, 2), **{d: (0,) for d in DATASETS[1:]}},
            steps=300, batch_size=16, multiples=32, eval_tokens=16384,
            superseded_by="results/lm_cpu_v2/README.md")
DEMO = Plan(out=ROOT / "results" / "demo" / "lm", datasets=("python-stdlib",),
            models=_plain("regular_gpt", "alibi", "kerple_log", "nope"), seeds={"python-stdlib": (0,)},
            steps=200, batch_size=16, multiples=16, eval_tokens=8192)
_POLICIES = ("train", "per_position")  # scored besides each RegularGPT's own adaptive depth
V2 = Plan(
    out=ROOT / "results" / "lm_cpu_v2", datasets=("python-stdlib", "debian-prose"),
    models=(
        Variant("regular_gpt", "regular_gpt", (), _POLICIES),  # the paper's settings: C 4, K 4, learned pad, r ~ N(0, 0.02)
        Variant("alibi", "alibi"),
        # one-knob ablations and the all-knobs row: python-stdlib, seed 0 only (the CPU budget); C = 8, the best
        # of them at seed 0, gets every seed and the second corpus
        Variant("rg_recency", "regular_gpt", ("model.rel_bias_init=recency",), _POLICIES, ("python-stdlib",), (0,)),
        Variant("rg_depth_init", "regular_gpt", ("model.depth_scaled_init=true",), _POLICIES, ("python-stdlib",), (0,)),
        Variant("rg_pad_mask", "regular_gpt", ("model.pad=mask",), _POLICIES, ("python-stdlib",), (0,)),
        Variant("rg_c8", "regular_gpt", ("model.chunk_size=8",), _POLICIES),
        Variant("rg_all", "regular_gpt", ("model.rel_bias_init=recency", "model.depth_scaled_init=true",
                                          "model.pad=mask"), _POLICIES, ("python-stdlib",), (0,)),
        # C = T = 64: one depth step of full causal attention with a learned scalar per offset (no dilation at
        # the training length): what the sparse tree costs at 1×, added after C = 8 beat C = 4 by 11%
        Variant("rg_c64", "regular_gpt", ("model.chunk_size=64",), _POLICIES, ("python-stdlib",), (0,)),
        # the baselines besides ALiBi: one seed per corpus
        *(Variant(n, n, seeds=(0,)) for n in ("kerple_log", "kerple_power", "t5", "rope", "nope")),
    ),
    seeds={"python-stdlib": (0, 1, 2), "debian-prose": (0,)},
    steps=1200, batch_size=16, multiples=32, eval_tokens=16384,
    sliding_check=("regular_gpt", "alibi"),
)
# The longer-training-length check of v2 (issue 11, "if the budget allows"): the best RegularGPT variant of v2 at 1×
# (C = 8) against ALiBi, trained at T = 256 on the same 1.2M tokens (300 steps), evaluated to 32× = 8192.
V2_T256 = Plan(
    out=ROOT / "results" / "lm_cpu_v2_t256", datasets=("python-stdlib",),
    models=(Variant("rg_c8", "regular_gpt", ("model.chunk_size=8",), _POLICIES), Variant("alibi", "alibi")),
    seeds={"python-stdlib": (0,)}, steps=300, batch_size=16, multiples=32, eval_tokens=16384, train_length=256,
)
STUDIES = {"v1": FULL, "v2": V2, "v2-t256": V2_T256}


def rel_path(path: Path) -> str:
    """`path` relative to the checkout when it lies inside it (commands and reports quote it so), else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def train_overrides(plan: Plan, dataset: str, seed: int, variant: Variant | None = None) -> list[str]:
    return [*(variant.sets if variant else ()), f"data.path={rel_path(plan.data_root / dataset)}",
            f"data.seq_len={plan.train_length}", f"model.vocab_size={VOCAB}",
            f"train.seed={seed}", f"train.steps={plan.steps}", f"train.batch_size={plan.batch_size}",
            "train.eval_every=0", "train.save_every=0", "train.keep_last=1", "logging.progress=false",
            "logging.wandb=false"]
