"""The user-fixable error of text generation (bad prompt, sampling settings, or a length the model cannot reach)."""

from __future__ import annotations

from regulargpt.errors import UserError

__all__ = ["GenerationError"]


class GenerationError(UserError, ValueError):
    """A generation request that cannot run as asked; the message says what to change."""
