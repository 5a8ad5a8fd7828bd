"""Parity Check (Deletang et al. 2023; RegularGPT Table 2 varies P(token = 1))."""
import torch

from regulargpt.tasks.base import Task


class ParityCheck(Task):
    """Label = (number of 1s) mod 2. Example: "0110 -> 2 ones -> class 0"; "1010100 -> 3 ones -> class 1".

    Sampling: i.i.d. bits with P(1) = `p_one` (the authors hard-code 0.5; RegularGPT's Table 2 varies it).
    """

    name = "parity_check"
    input_vocab_size = 2
    num_classes = 2

    def __init__(self, p_one: float = 0.5) -> None:
        if isinstance(p_one, bool) or not isinstance(p_one, (int, float)) or not 0.0 < p_one < 1.0:
            raise ValueError(f"parity_check: p_one must be a number in (0, 1), got {p_one!r}")
        self.p_one = float(p_one)

    def _sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        uniform = torch.rand((batch_size, length), generator=generator, dtype=torch.float64)  # (B, T)
        inputs = (uniform < self.p_one).long()
        return inputs, self.label(inputs)

    def label(self, inputs: torch.Tensor) -> torch.Tensor:
        self._check_tokens(inputs)
        return inputs.sum(dim=1) % 2
