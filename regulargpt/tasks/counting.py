"""Star languages of a fixed word: (aa)*, (aaaa)* and (abab)* (Bhattamishra et al. 2020; RegularGPT's code)."""
from regulargpt.tasks.base import DfaMembershipTask

# name -> (the word w of the language w*, alphabet size); symbols 0 = a, 1 = b.
STAR_WORDS: dict[str, tuple[tuple[int, ...], int]] = {
    "aa_star": ((0, 0), 1),
    "aaaa_star": ((0, 0, 0, 0), 1),
    "abab_star": ((0, 1, 0, 1), 2),
}


class StarTask(DfaMembershipTask):
    """w*: label 1 iff the string is w repeated k >= 0 times.

    (aa)* and (aaaa)* use a one-letter alphabet (every input is all zeros), so the label depends only on the length:
    "000 -> odd length -> class 0" for (aa)*, and every batch at one length has a single label; that is the task.
    (abab)* = (0101)*: "01010101 -> class 1", "01011010 -> class 0"; lengths not divisible by 4 have no members.
    The DFA counts the position inside w (states 0..|w|-1) plus a dead state; accepting = {0}.
    Sampling: `DfaMembershipTask` (half positives, half negatives where the length has both).
    """

    def __init__(self, name: str) -> None:
        if name not in STAR_WORDS:
            raise ValueError(f"unknown star language {name!r}; choose from {sorted(STAR_WORDS)}")
        word, alphabet_size = STAR_WORDS[name]
        dead = len(word)
        transitions = [[(i + 1) % dead if a == w else dead for a in range(alphabet_size)] for i, w in enumerate(word)]
        super().__init__(name, [*transitions, [dead] * alphabet_size], {0})
