"""State clustering (RegularGPT paper §7.3): do the hidden states of every depth step form one cluster per
transition of the task's automaton (2 for Parity, 5 for Cycle Navigation)?

For each depth step l of tree mode on long inputs, the kept states (points in R^d) are

* projected to 2-D by PCA: X ← X − mean(X); X = U S Vᵀ; the coordinates are X V[:, :2] (what the figure shows);
* clustered by k-means (k-means++ seeding, Lloyd iterations, best of `restarts` by inertia) for k = 2..k_max,
  with k* = argmax_k silhouette(k); silhouette s(i) = (b(i) − a(i)) / max(a(i), b(i)), a(i) the mean distance to
  the other members of i's cluster, b(i) the smallest mean distance to another cluster (s = 0 in a singleton);
* compared with the true transition of each state's span (see :mod:`regulargpt.evaluation.probes`):
  purity = Σ_clusters max_label n(c, y) / N (each cluster read as its majority label) and
  inverse purity = Σ_labels max_cluster n(c, y) / N (each label found in its majority cluster); both are 1 exactly
  when the clusters are the labels.

Clustering runs in the full d-dimensional state space (PCA only draws the picture), on at most `max_points` states
per step and `silhouette_points` of them for the silhouette (O(n²) distances), sampled with a fixed seed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from regulargpt.evaluation.probes import span_transitions, tree_spans, tree_states
from regulargpt.evaluation.plotting import pyplot
from regulargpt.files import atomic_savefig
from regulargpt.model import RegularGPTClassifier

__all__ = ["StepClusters", "choose_k", "cluster_depth_steps", "kmeans", "pca", "plot_steps", "purity", "silhouette"]


def pca(x: Tensor, dims: int = 2) -> tuple[Tensor, Tensor]:
    """x (N, d) → (coordinates (N, dims) on the top principal axes, explained-variance ratio of each (dims,))."""
    centred = x - x.mean(dim=0)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)  # vh (min(N, d), d), rows = principal axes
    var = s**2
    return centred @ vh[:dims].T, var[:dims] / var.sum().clamp_min(torch.finfo(var.dtype).tiny)


def _kmeans_pp(x: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """k-means++ seeding: each next centre is drawn with probability ∝ squared distance to the nearest centre."""
    n = x.shape[0]
    centres = [x[torch.randint(n, (1,), generator=generator)].squeeze(0)]
    nearest = ((x - centres[0]) ** 2).sum(dim=1)  # (N,)
    for _ in range(1, k):
        weights = nearest if nearest.sum() > 0 else torch.ones_like(nearest)  # all points on the centres: uniform
        centre = x[torch.multinomial(weights, 1, generator=generator)].squeeze(0)
        centres.append(centre)
        nearest = torch.minimum(nearest, ((x - centre) ** 2).sum(dim=1))
    return torch.stack(centres)  # (k, d)


def kmeans(x: Tensor, k: int, seed: int = 0, restarts: int = 4, iterations: int = 100) -> tuple[Tensor, float]:
    """x (N, d) → (cluster id of each point (N,), inertia Σ‖x − centre‖²), the best of `restarts` seedings."""
    generator = torch.Generator().manual_seed(seed)
    best: tuple[Tensor, float] | None = None
    for _ in range(restarts):
        centres = _kmeans_pp(x, k, generator)
        assign = torch.full((x.shape[0],), -1, dtype=torch.long)
        for _ in range(iterations):
            new = torch.cdist(x, centres).argmin(dim=1)  # (N,)
            if torch.equal(new, assign):
                break
            assign = new
            for c in range(k):
                members = x[assign == c]
                if len(members):  # an emptied cluster keeps its old centre
                    centres[c] = members.mean(dim=0)
        inertia = float(((x - centres[assign]) ** 2).sum())
        if best is None or inertia < best[1]:
            best = (assign, inertia)
    assert best is not None
    return best


def silhouette(x: Tensor, labels: Tensor) -> float:
    """Mean silhouette of the labelling `labels` (N,) of points x (N, d); needs at least 2 distinct labels."""
    ids, labels = torch.unique(labels, return_inverse=True)
    if len(ids) < 2:
        raise ValueError("silhouette needs at least two clusters")
    dist = torch.cdist(x, x)  # (N, N)
    onehot = torch.nn.functional.one_hot(labels, len(ids)).to(x.dtype)  # (N, k)
    sizes = onehot.sum(dim=0)  # (k,)
    mean_to = dist @ onehot  # (N, k): summed distance from each point to each cluster
    own = sizes[labels]  # (N,)
    a = mean_to.gather(1, labels[:, None]).squeeze(1) / (own - 1).clamp_min(1)  # self-distance is 0
    others = (mean_to / sizes).scatter(1, labels[:, None], float("inf"))
    b = others.min(dim=1).values
    s = torch.where(own > 1, (b - a) / torch.maximum(a, b).clamp_min(torch.finfo(x.dtype).tiny), 0.0)
    return float(s.mean())


def purity(clusters: Tensor, labels: Tensor) -> tuple[float, float]:
    """(purity, inverse purity) of a clustering against true labels; example: clusters [0,0,1,1], labels [0,0,0,1]
    → purity (2 + 1)/4 = 0.75, inverse purity (2 + 1)/4 = 0.75."""
    _, c = torch.unique(clusters, return_inverse=True)
    _, y = torch.unique(labels, return_inverse=True)
    table = torch.zeros(int(c.max()) + 1, int(y.max()) + 1, dtype=torch.long)  # (clusters, labels)
    table.index_put_((c, y), torch.ones_like(c), accumulate=True)
    n = len(clusters)
    return float(table.max(dim=1).values.sum()) / n, float(table.max(dim=0).values.sum()) / n


def choose_k(x: Tensor, k_max: int = 8, seed: int = 0,
             silhouette_points: int = 2000) -> tuple[int, dict[int, float], Tensor]:
    """k-means for k = 2..k_max → (k* with the highest silhouette, {k: silhouette}, cluster ids of all x for k*)."""
    generator = torch.Generator().manual_seed(seed)
    sub = torch.randperm(x.shape[0], generator=generator)[:silhouette_points]
    scores: dict[int, float] = {}
    fits: dict[int, Tensor] = {}
    for k in range(2, min(k_max, x.shape[0] - 1) + 1):
        fits[k], _ = kmeans(x, k, seed=seed + k)
        scores[k] = silhouette(x[sub], fits[k][sub]) if fits[k][sub].unique().numel() > 1 else -1.0
    best = max(scores, key=lambda k: scores[k])
    return best, scores, fits[best]


@dataclass
class StepClusters:
    """One depth step's states: where they sit, what they should encode, and what the clustering found."""

    step: int  # depth step l (0-based); "all" steps pooled is step = -1
    kept_positions: int  # states per sequence at this step
    span_min: int  # shortest and longest covered span (tokens); C^(l+1) for K = 1 away from the left edge
    span_max: int
    points: int  # states clustered (after subsampling)
    labels_present: int  # distinct true transitions among them
    distinct_states: int  # distinct state vectors among them (coordinates rounded to 1e-4): a span of n tokens
    #                       has at most |Σ|^n different inputs, so early steps hold few exact points
    k_best: int
    silhouettes: dict[int, float]
    purity: float
    inverse_purity: float
    label_silhouette: float  # silhouette of the true transitions themselves (nan with one label)
    pca_variance: tuple[float, float]  # explained-variance ratio of the two plotted axes

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _summarise(step: int, kept: int, spans: tuple[int, int], x: Tensor, y: Tensor, k_max: int, seed: int,
               silhouette_points: int) -> tuple[StepClusters, Tensor]:
    """Cluster states x (N, d) with true transitions y (N,) → (summary, 2-D PCA coordinates (N, 2))."""
    x = x.double()
    coords, variance = pca(x)
    k_best, scores, assign = choose_k(x, k_max, seed, silhouette_points)
    pur, inv = purity(assign, y)
    sub = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:silhouette_points]
    label_sil = silhouette(x[sub], y[sub]) if y[sub].unique().numel() > 1 else float("nan")
    distinct = int(torch.unique((x * 1e4).round(), dim=0).shape[0])
    summary = StepClusters(step, kept, spans[0], spans[1], x.shape[0], int(y.unique().numel()), distinct, k_best,
                           scores, pur, inv, label_sil, (float(variance[0]), float(variance[1])))
    return summary, coords


def cluster_depth_steps(model: RegularGPTClassifier, task: str, tokens: Tensor, k_max: int = 8, seed: int = 0,
                        max_points: int = 20000, silhouette_points: int = 2000
                        ) -> list[tuple[StepClusters, Tensor, Tensor]]:
    """Every depth step of `tokens` (B, T), then all steps pooled: [(summary, PCA coords (N, 2), labels (N,))].

    The pooled entry (step −1) stacks every step's states, so one transition should land in one cluster at
    every depth (the shared weights make that possible).
    """
    cfg = model.config
    states = tree_states(model, tokens)
    spans = tree_spans(tokens.shape[1], cfg.chunk_size, cfg.thickness)
    generator = torch.Generator().manual_seed(seed)
    out, pooled_x, pooled_y = [], [], []
    for step, (h, span) in enumerate(zip(states, spans)):
        labels = span_transitions(task, tokens, span)  # (B, n_l)
        x, y = h.reshape(-1, h.shape[-1]), labels.reshape(-1)  # (B·n_l, d), (B·n_l,)
        pick = torch.randperm(x.shape[0], generator=generator)[:max_points]
        x, y = x[pick], y[pick]
        pooled_x.append(x)
        pooled_y.append(y)
        widths = span.end - span.start + 1
        summary, coords = _summarise(step, len(span), (int(widths.min()), int(widths.max())), x, y, k_max,
                                     seed, silhouette_points)
        out.append((summary, coords, y))
    x, y = torch.cat(pooled_x), torch.cat(pooled_y)
    pick = torch.randperm(x.shape[0], generator=generator)[:max_points]
    widths = np.concatenate([s.end - s.start + 1 for s in spans])  # every state's span width
    summary, coords = _summarise(-1, len(widths), (int(widths.min()), int(widths.max())), x[pick], y[pick], k_max,
                                 seed, silhouette_points)
    out.append((summary, coords, y[pick]))
    return out


def plot_steps(results: list[tuple[StepClusters, Tensor, Tensor]], path: str | Path, title: str,
               max_drawn: int = 3000) -> None:
    """A grid of 2-D PCA scatter plots, one panel per depth step plus the pooled one, coloured by true transition."""
    plt = pyplot(path)
    if plt is None:
        return

    cols = min(4, len(results))
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), squeeze=False)
    cmap = plt.get_cmap("tab10")
    generator = torch.Generator().manual_seed(0)
    for ax, (summary, coords, labels) in zip(axes.flat, results):
        pick = torch.randperm(len(labels), generator=generator)[:max_drawn]
        pts, lab = coords[pick].numpy(), labels[pick].numpy()
        for value in sorted(set(lab.tolist())):
            mask = lab == value
            ax.scatter(pts[mask, 0], pts[mask, 1], s=4, alpha=0.5, color=cmap(value % 10), label=str(value))
        name = "all steps" if summary.step < 0 else f"step {summary.step} (span {summary.span_max})"
        ax.set_title(f"{name}: k*={summary.k_best}, purity {summary.purity:.2f}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[len(results):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, title="transition", loc="upper right", markerscale=3, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.94, 0.96))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
