"""Recurrent formal-language baselines: tanh RNN and LSTM sequence classifiers.

h_t = tanh(W_x x_t + W_h h_{t-1} + b) (RNN) or the LSTM cell; `n_layers` stacked layers of width d_model;
class logits = W_o h_T + b_o, read after the last token.
"""

from __future__ import annotations

from torch import Tensor, nn

from regulargpt.config import ModelConfig

__all__ = ["RecurrentClassifier"]


class RecurrentClassifier(nn.Module):
    """tokens (B, T) → class logits (B, num_classes) from the final hidden state of an RNN (tanh) or LSTM."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        rnn_cls = nn.LSTM if cfg.architecture == "lstm" else nn.RNN
        self.rnn = rnn_cls(cfg.d_model, cfg.d_model, num_layers=cfg.n_layers, batch_first=True,
                           dropout=cfg.dropout if cfg.n_layers > 1 else 0.0)
        self.head = nn.Linear(cfg.d_model, cfg.num_classes)
        nn.init.normal_(self.embed.weight, 0.0, cfg.init_std)

    def forward(self, tokens: Tensor) -> Tensor:
        states, _ = self.rnn(self.embed(tokens))  # (B, T, d)
        return self.head(states[:, -1])

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, length: int) -> int:
        """Training FLOPs per token: 3 × 2 × (recurrent weights per step); the head runs once per sequence."""
        del length  # a recurrent step costs the same at every position
        return 3 * 2 * sum(p.numel() for name, p in self.rnn.named_parameters() if "weight" in name)
