"""eval/bench_step_ops.py counts ATen calls exactly: a hand-built module's known ops, and a planted extra cat."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
from bench_step_ops import count_ops, training_step  # noqa: E402


def test_known_ops_counted_exactly() -> None:
    a, b = torch.ones(2), torch.zeros(2)
    counts = count_ops(lambda: torch.cat([a, b]).clone().clone())
    assert counts["aten.cat"] == 1 and counts["aten.clone"] == 2 and sum(counts.values()) == 3


def test_planted_cat_changes_count_and_step_is_stable() -> None:
    class Toy(torch.nn.Module):
        def __init__(self, extra: bool) -> None:
            super().__init__()
            self.emb, self.extra = torch.nn.Embedding(10, 4), extra

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.emb(x)
            if self.extra:
                h = torch.cat([h[..., :2], h[..., 2:]], dim=-1)
            return h @ self.emb.weight.t()

    def step_counts(extra: bool) -> int:
        torch.manual_seed(0)
        model = Toy(extra)
        step = training_step(model, torch.optim.AdamW(model.parameters(), foreach=True),
                             torch.randint(0, 10, (1, 9)))
        step()
        first, second = count_ops(step), count_ops(step)
        assert first == second and sum(first.values()) > 0
        return first["aten.cat"]

    assert step_counts(True) == step_counts(False) + 1
