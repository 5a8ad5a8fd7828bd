"""Cycle Navigation (Deletang et al. 2023): where does a walk on a 5-cycle end?"""
import torch

from regulargpt.tasks.base import Task

CYCLE_LENGTH = 5


class CycleNavigation(Task):
    """Tokens 0 = left, 1 = stay, 2 = right move an agent on a cycle of 5 states from state 0.

    Label = final state = sum(a_t - 1) mod 5. Example: "2 0 1 0 0" = +1 -1 0 -1 -1 -> -2 -> class 3.
    Sampling: actions uniform over {0, 1, 2}.
    """

    name = "cycle_navigation"
    input_vocab_size = 3
    num_classes = CYCLE_LENGTH

    def _sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randint(0, 3, (batch_size, length), generator=generator)  # (B, T)
        return inputs, self.label(inputs)

    def label(self, inputs: torch.Tensor) -> torch.Tensor:
        self._check_tokens(inputs)
        return (inputs - 1).sum(dim=1) % CYCLE_LENGTH  # torch % is non-negative for a positive divisor
