"""The CPU-scale language-model studies as data: which (dataset, variant, seed) a study trains, with which overrides,
and at which lengths it is scored. ``STUDIES`` holds v1 (results/lm_cpu, superseded), v2 (results/lm_cpu_v2),
v2-t256, v3 (results/lm_cpu_v3, staged: equal compute, training budgets, the windowed baseline, the position
encodings of 2023 with passkey accuracy) and v4
(results/lm_cpu_v4: large C at T = 256, the paper's regime); ``DEMO`` is `make demo`'s small version. Paths are relative to the checkout (``ROOT``), whose configs/,
data_prep/, launch/ and eval/ the stages run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from regulargpt.config.rope_scaling import check_rope_scaling, rope_scaling_key
from regulargpt.evaluation.retrieval_probes import PROBES

__all__ = ["DATASETS", "DEMO", "FULL", "MODELS", "ROOT", "STUDIES", "V2", "V2_T256", "V3", "V3_BUDGETS",
           "V3_BUDGET_MODELS", "V3_EQUAL_COMPUTE", "V3_POSITIONS", "V3_WINDOWS", "V4", "V4_EQUAL_COMPUTE", "VOCAB",
           "Plan", "RopeScaling", "Stage", "Variant", "rel_path", "train_overrides"]

ROOT = Path(__file__).resolve().parents[3]  # the checkout: regulargpt/experiments/lm_comparison/plans.py

MODELS = ("regular_gpt", "alibi", "t5", "kerple_log", "kerple_power", "rope", "nope")  # configs/tiny/<name>.json
DATASETS = ("python-stdlib", "debian-prose", "debian-code", "debian-latex")
VOCAB = 2048


@dataclass(frozen=True)
class RopeScaling:
    """An evaluation-time RoPE scaling a variant's weights are also scored with (eval/extrapolate.py --rope-scaling;
    the Hugging Face ``rope_scaling`` object, :mod:`regulargpt.config.rope_scaling`), checked on construction: a bad
    rope_type, a factor < 1 or a missing training length is a RopeScalingError (a ValueError) naming the key. Its
    rows are keyed by :attr:`key` and reported as ``<variant>+<rope_type>``. Example: RopeScaling("yarn", 32, 64)
    (2048 = 32 × the training length 64) keys its rows
    '{"factor":32.0,"original_max_position_embeddings":64,"rope_type":"yarn"}'."""

    rope_type: str
    factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        check_rope_scaling(self.as_dict(), f"rope scaling {self.rope_type!r}")

    def as_dict(self) -> dict[str, str | float | int]:
        return {"rope_type": self.rope_type, "factor": self.factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}

    @property
    def key(self) -> str:
        """The canonical JSON of the checked scaling: the ``rope_scaling`` field of its result rows."""
        return str(rope_scaling_key(check_rope_scaling(self.as_dict())))


@dataclass(frozen=True)
class Variant:
    """One trained row of a study: configs/tiny/<config>.json with `sets` overrides, run as OUT/runs/<dataset>/
    <name>-seed<k>. `depth_policies`: extra evaluation-time depth policies its weights are also scored with;
    `datasets`: where it is trained (empty = every dataset of the plan); `seeds`: which of the plan's seeds it is
    trained with (empty = all of them), e.g. an ablation row with seeds=(0,) beside 3-seed headline rows;
    `rope_scalings`: evaluation-time RoPE scalings its weights are also scored with (a RoPE config only; one per
    rope_type, since the report names each row <name>+<rope_type>)."""

    name: str
    config: str
    sets: tuple[str, ...] = ()
    depth_policies: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    steps: int = 0  # training steps of this row; 0 = the plan's (a training-budget row sets its own)
    # What the row is matched to RegularGPT on: "parameters" (checked: within ±10%) or "layer_applications" (the
    # 12-layer baselines: RegularGPT's K·L_train = 12 layer applications per token, ~2.2× its parameters)
    matched: str = "parameters"
    rope_scalings: tuple[RopeScaling, ...] = ()

    def __post_init__(self) -> None:
        wrong = [s for s in self.rope_scalings if not isinstance(s, RopeScaling)]
        if wrong:
            raise TypeError(f"variant {self.name}: rope_scalings takes RopeScaling objects, not {wrong[0]!r}")
        types = [s.rope_type for s in self.rope_scalings]
        if len(types) != len(set(types)):
            raise ValueError(f"variant {self.name}: rope_scalings {types} repeat a rope_type (its rows are reported "
                             f"as {self.name}+<rope_type>)")


@dataclass(frozen=True)
class Stage:
    """One step of a staged study (v3): trainings run in this order, each stage's before the next's, so that the
    most informative rows finish first. `runs`: (variant name, seeds) pairs; `why`: what the stage answers."""

    name: str
    why: str
    runs: tuple[tuple[str, tuple[int, ...]], ...]


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
    # A staged study (v3): its trainings are exactly these stages' runs, in stage order (every dataset of the plan),
    # instead of the seed-major order over the variants' own seeds
    stages: tuple[Stage, ...] = ()
    then: tuple[str, ...] = ()  # studies (keys of STUDIES) the same command runs after this one, e.g. the T = 256 pair
    # (variant, depth policy or "") whose seed-0 run gets eval/receptive_field.py at receptive_field_length
    receptive_fields: tuple[tuple[str, str], ...] = ()
    receptive_field_length: int = 1024
    # (variant, probe) whose seed-0 run on the first dataset gets eval/extrapolate.py --probe at the plan's lengths,
    # probe_trials random trials at each of the probe's 5 default depths (rows of the same results.jsonl); a
    # variant the plan does not train is not probed (as receptive_fields)
    probes: tuple[tuple[str, str], ...] = ()
    probe_trials: int = 10

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        staged = [(v, s) for stage in self.stages for v, seeds in stage.runs for s in seeds]
        unknown = sorted({v for v, _ in staged} - set(names))
        if unknown or len(staged) != len(set(staged)):
            raise ValueError(f"plan {self.out}: stages name unknown variants {unknown} or a (variant, seed) twice")
        bad = [p for _, p in self.probes if p not in PROBES]
        if bad or self.probe_trials < 1:
            raise ValueError(f"plan {self.out}: probes {bad} are not probes (accepted: {', '.join(PROBES)}), or "
                             f"probe_trials {self.probe_trials} < 1")

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

    def steps_of(self, variant: Variant) -> int:
        return variant.steps or self.steps

    def tokens_of(self, variant: Variant) -> int:
        """Training tokens of one row: its steps × batch × training length."""
        return self.steps_of(variant) * self.batch_size * self.train_length

    def trainings(self) -> list[tuple[str, Variant, int]]:
        """(dataset, variant, seed): a staged plan's stage runs in stage order; otherwise seed-major within each
        dataset so that every row gets its first seed first."""
        if self.stages:
            by_name = {m.name: m for m in self.models}
            return [(d, by_name[v], s) for d in self.datasets for stage in self.stages for v, seeds in stage.runs
                    for s in seeds]
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

# v3 (issues 25 and 28): the v2 questions at equal compute, as training grows, and against a plain local window.
# python-stdlib, T = 64, the v2 settings (1200 steps × 16 × 64 = 1.2M tokens unless a row sets its steps).
# Budget rows: <name>_s400 (0.4M tokens) and <name>_s3600 (3.7M) beside the 1.2M rows <name>.
_TRAIN = ("train",)  # RegularGPT rows are scored with their own adaptive depth and the training depth
_WINDOW = ("model.window=64",)  # W = T_train: trains exactly as the unwindowed model, reads 64 keys past it
_L12 = ("model.n_layers=12",)  # RegularGPT's K·L_train = 4·3 layer applications per token
V3_BUDGETS = {400: "_s400", 1200: "", 3600: "_s3600"}  # steps → the suffix of a budget row's name
_V3_BUDGET_ROWS = (
    Variant("regular_gpt", "regular_gpt", (), _TRAIN),  # the paper's settings: C 4, K 4
    Variant("rg_c8", "regular_gpt", ("model.chunk_size=8",), _TRAIN),  # v2's best variant
    Variant("alibi", "alibi"),
)
V3_BUDGET_MODELS = tuple(m.name for m in _V3_BUDGET_ROWS)
# Issue 51 item 5: the position encodings of 2023 at one seed, 4 layers (matched on parameters), unwindowed; RoPE is
# also scored with YaRN and dynamic NTK at factor 32 = 2048 / 64, the longest length over the training length
V3_POSITIONS = ("fire", "xpos", "sandwich", "rope")
_TO_2048 = (RopeScaling("yarn", 32, 64), RopeScaling("dynamic", 32, 64))
V3 = Plan(
    out=ROOT / "results" / "lm_cpu_v3", datasets=("python-stdlib",),
    models=(
        *_V3_BUDGET_ROWS,
        Variant("alibi_l12", "alibi", _L12, matched="layer_applications"),
        Variant("kerple_log", "kerple_log"),
        Variant("kerple_log_l12", "kerple_log", _L12, matched="layer_applications"),
        Variant("nope_w64", "nope", _WINDOW),
        Variant("rope_w64", "rope", _WINDOW),
        Variant("nope_w64_l12", "nope", _WINDOW + _L12, matched="layer_applications"),
        Variant("rope_w64_l12", "rope", _WINDOW + _L12, matched="layer_applications"),
        *(dataclasses.replace(m, name=m.name + V3_BUDGETS[steps], steps=steps)
          for steps in (400, 3600) for m in _V3_BUDGET_ROWS),
        *(Variant(n, n, rope_scalings=_TO_2048 if n == "rope" else ()) for n in V3_POSITIONS),
    ),
    seeds={"python-stdlib": (0, 1, 2)},
    steps=1200, batch_size=16, multiples=32, eval_tokens=16384,
    stages=(
        Stage("1x-core-seed0", "windowed vs RegularGPT-train at 1× and 32×, and the gap at equal compute (1 seed)",
              (("regular_gpt", (0,)), ("alibi", (0,)), ("nope_w64", (0,)), ("rope_w64", (0,)),
               ("alibi_l12", (0,)), ("rg_c8", (0,)))),
        Stage("budget-0.4M-seed0", "a second training budget: the gap at 0.4M tokens (1 seed)",
              (("regular_gpt_s400", (0,)), ("rg_c8_s400", (0,)), ("alibi_s400", (0,)))),
        Stage("1x-core-seed1", "seed spread of every 1× answer and of the 1.2M budget point",
              (("regular_gpt", (1,)), ("alibi", (1,)), ("nope_w64", (1,)), ("rope_w64", (1,)),
               ("alibi_l12", (1,)), ("rg_c8", (1,)))),
        Stage("budget-3.6M-seed0", "the third training budget: the trend's 3.6M point (1 seed)",
              (("regular_gpt_s3600", (0,)), ("rg_c8_s3600", (0,)), ("alibi_s3600", (0,)))),
        Stage("equal-applications", "KERPLE-log at 4 and 12 layers, the windows at 12 layers (1 seed)",
              (("kerple_log", (0,)), ("kerple_log_l12", (0,)), ("nope_w64_l12", (0,)), ("rope_w64_l12", (0,)))),
        Stage("budgets-seed1", "seed spread of the 0.4M and 3.6M points",
              (("regular_gpt_s400", (1,)), ("rg_c8_s400", (1,)), ("alibi_s400", (1,)),
               ("regular_gpt_s3600", (1,)), ("rg_c8_s3600", (1,)), ("alibi_s3600", (1,)))),
        Stage("third-seeds", "3 seeds for ALiBi-12 (and the ALiBi and RegularGPT rows it is paired with)",
              (("alibi_l12", (2,)), ("alibi", (2,)), ("regular_gpt", (2,)))),
        Stage("positions-2023", "FIRE, xPos, Sandwich and RoPE (+ YaRN, dynamic NTK at evaluation) with passkey "
              "accuracy (1 seed)", tuple((n, (0,)) for n in V3_POSITIONS)),
    ),
    then=("v2-t256",),
    receptive_fields=(("regular_gpt", "train"), ("rg_c8", "train"), ("alibi", ""), ("nope_w64", ""),
                      ("rope_w64", "")),
    probes=tuple((n, "passkey") for n in V3_POSITIONS),  # the old runs' folders are gone: only the new rows
    probe_trials=20,
)
V3_EQUAL_COMPUTE = {"alibi": "alibi_l12", "kerple_log": "kerple_log_l12"}  # 4-layer row → its 12-layer row
V3_WINDOWS = ("nope_w64", "rope_w64", "nope_w64_l12", "rope_w64_l12")

# v4 (issue 41): RegularGPT in the paper's own language-model regime. T = 256 with C = 16 or 64: two depth steps, the
# first a local window of C tokens with a learned scalar per offset, the second dilated by C. Against ALiBi at 4
# layers (equal parameters) and 8 (equal layer applications: K·L_train = 4·2) and a RoPE window of 64 keys; 300 steps
# × 16 × 256 = 1.2M tokens (as v2-t256), evaluated to 32× = 8192; seeds 0 and 1, paired.
_V4_PAIRED = ("rg_c16", "rg_c64", "alibi", "alibi_l8", "rope_w64")
V4 = Plan(
    out=ROOT / "results" / "lm_cpu_v4", datasets=("python-stdlib",),
    models=(
        Variant("rg_c16", "regular_gpt", ("model.chunk_size=16",), _TRAIN),
        Variant("rg_c64", "regular_gpt", ("model.chunk_size=64",), _TRAIN),
        Variant("alibi", "alibi"),
        Variant("alibi_l8", "alibi", ("model.n_layers=8",), matched="layer_applications"),
        Variant("rope_w64", "rope", _WINDOW),
    ),
    seeds={"python-stdlib": (0, 1)},
    steps=300, batch_size=16, multiples=32, eval_tokens=16384, train_length=256,
    stages=(
        Stage("seed0", "every answer at one seed: RegularGPT C = 16 and 64 against ALiBi-4, ALiBi-8 and the window",
              tuple((name, (0,)) for name in _V4_PAIRED)),
        Stage("seed1", "the seed spread of every answer (pairs with seed 0)",
              tuple((name, (1,)) for name in _V4_PAIRED)),
    ),
    receptive_fields=(("rg_c16", ""), ("rg_c16", "train"), ("rg_c64", ""), ("rg_c64", "train"), ("alibi", ""),
                      ("alibi_l8", ""), ("rope_w64", "")),
    receptive_field_length=2048,
)
V4_EQUAL_COMPUTE = {"alibi": "alibi_l8"}  # 4-layer row → its 8-layer row (RegularGPT's 8 layer applications at T = 256)
STUDIES = {"v1": FULL, "v2": V2, "v2-t256": V2_T256, "v3": V3, "v4": V4}


def rel_path(path: Path) -> str:
    """`path` relative to the checkout when it lies inside it (commands and reports quote it so), else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def train_overrides(plan: Plan, dataset: str, seed: int, variant: Variant | None = None) -> list[str]:
    return [*(variant.sets if variant else ()), f"data.path={rel_path(plan.data_root / dataset)}",
            f"data.seq_len={plan.train_length}", f"model.vocab_size={VOCAB}",
            f"train.seed={seed}", f"train.steps={plan.steps_of(variant) if variant else plan.steps}",
            f"train.batch_size={plan.batch_size}",
            "train.eval_every=0", "train.save_every=0", "train.keep_last=1", "logging.progress=false",
            "logging.wandb=false"]
