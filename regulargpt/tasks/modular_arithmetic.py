"""Modular Arithmetic, simple version (Deletang et al. 2023): evaluate "d op d op ... d" modulo m."""
import torch

from regulargpt.tasks.base import Task

OPERATORS = ("+", "-", "*")  # token ids modulus + 0, modulus + 1, modulus + 2


class ModularArithmetic(Task):
    """Label = value of the expression mod m, with * binding tighter than + and -, in {0, ..., m-1}.

    Tokens: digits 0..m-1, then '+', '-', '*' = m, m+1, m+2. Examples (m = 5): "2+3*4 -> 14 -> class 4";
    "1-2*3 -> -5 -> class 0"; "1-1-1 -> -1 -> class 4".

    Sampling (the authors' rule): an expression always has odd length, so `sample(length=T)` returns
    T tokens for odd T and T-1 tokens for even T; digits uniform in 0..m-1 at even positions, operators
    uniform at odd positions. With `leading_plus` (RegularGPT's fork) a '+' token is prepended to that
    expression, giving T+1 tokens for odd T and T for even T. The returned tensor's width is the real length.
    """

    name = "modular_arithmetic"

    def __init__(self, modulus: int = 5, leading_plus: bool = False) -> None:
        if isinstance(modulus, bool) or not isinstance(modulus, int) or modulus < 2:
            raise ValueError(f"modular_arithmetic: modulus must be an int >= 2, got {modulus!r}")
        if not isinstance(leading_plus, bool):
            raise ValueError(f"modular_arithmetic: leading_plus must be a bool, got {leading_plus!r}")
        self.modulus = modulus
        self.leading_plus = leading_plus
        self.input_vocab_size = modulus + len(OPERATORS)
        self.num_classes = modulus

    def _sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        num_digits = (length + 1) // 2  # odd expression length 2 * num_digits - 1 <= length
        digits = torch.randint(0, self.modulus, (batch_size, num_digits), generator=generator)  # (B, D)
        ops = torch.randint(0, len(OPERATORS), (batch_size, num_digits - 1), generator=generator) + self.modulus
        inputs = torch.empty((batch_size, 2 * num_digits - 1), dtype=torch.long)  # (B, 2D-1)
        inputs[:, 0::2] = digits
        inputs[:, 1::2] = ops
        if self.leading_plus:
            plus = torch.full((batch_size, 1), self.modulus, dtype=torch.long)
            inputs = torch.cat([plus, inputs], dim=1)  # (B, 2D)
        return inputs, self.label(inputs)

    def label(self, inputs: torch.Tensor) -> torch.Tensor:
        """Sum of the signed terms, each term a product of digits, all mod m.

        The terms are found by a segmented product scan (log2 D vectorised steps): digit i starts a new term when it
        follows '+' or '-', a '-' negates the first factor of its term, and a term's value sits at its last digit.
        """
        self._check_tokens(inputs)
        m = self.modulus
        if self.leading_plus and not bool((inputs[:, 0] == m).all()):
            raise ValueError("modular_arithmetic: with leading_plus every expression must start with '+'")
        expr = inputs[:, 1:] if self.leading_plus else inputs  # (B, 2D-1)
        digits, ops = expr[:, 0::2], expr[:, 1::2] - m  # (B, D), (B, D-1) with ops 0 '+', 1 '-', 2 '*'
        if expr.shape[1] % 2 == 0 or bool((digits >= m).any()) or bool((ops < 0).any()):
            raise ValueError("modular_arithmetic: expressions must alternate digit, operator, ..., digit")
        first = torch.ones_like(digits[:, :1], dtype=torch.bool)  # (B, 1)
        starts = torch.cat([first, ops != 2], dim=1)  # (B, D) digit begins a term
        ends = torch.cat([starts[:, 1:], first], dim=1)  # (B, D) digit ends a term
        small = torch.uint8 if (m - 1) ** 2 <= 255 else torch.int64  # a product of two residues must fit
        values = (torch.where(torch.cat([~first, ops == 1], dim=1), -digits, digits) % m).to(small)  # (B, D)
        offset = 1
        while offset < values.shape[1]:  # values[:, i] becomes the product of its term's factors up to i
            values[:, offset:] = torch.where(
                starts[:, offset:], values[:, offset:], values[:, offset:] * values[:, :-offset] % m
            )
            starts[:, offset:] |= starts[:, :-offset].clone()
            offset *= 2
        return (values.long() * ends).sum(dim=1) % m
