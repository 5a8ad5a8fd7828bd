"""Even Pairs (Deletang et al. 2023): is the number of unequal adjacent pairs of a bit string even?"""
import torch

from regulargpt.tasks.base import Task


class EvenPairs(Task):
    """Label = (number of positions t with x_t != x_{t+1}) mod 2, i.e. whether the counts of "01" and "10" differ.

    Equivalently label = [x_0 != x_{T-1}]. Examples: "001110 -> one 01, one 10 -> 2 changes -> class 0";
    "0101001 -> 5 changes -> class 1". Sampling: uniform random bits.
    """

    name = "even_pairs"
    input_vocab_size = 2
    num_classes = 2

    def _sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randint(0, 2, (batch_size, length), generator=generator)  # (B, T)
        return inputs, self.label(inputs)

    def label(self, inputs: torch.Tensor) -> torch.Tensor:
        self._check_tokens(inputs)
        return (inputs[:, 1:] != inputs[:, :-1]).sum(dim=1) % 2
