"""Tomita grammars 1 and 3-7 (Tomita 1982; DFAs as in Bhattamishra et al. 2020 and RegularGPT's code)."""
from regulargpt.tasks.base import DfaMembershipTask

# number -> (transitions[state] = [next on 0, next on 1], accepting states); start state 0, the last state is dead
# where there is one.
TOMITA_DFAS: dict[int, tuple[list[list[int]], set[int]]] = {
    # 1*; the authors' code uses 0*, the same language with the symbols swapped.
    1: ([[1, 0], [1, 1]], {0}),
    # No odd run of 1s immediately followed by an odd run of 0s. States: 0 = even 1-run (or only 0s since),
    # 1 = odd 1-run, 3 / 2 = odd / even 0-run after an odd 1-run.
    3: ([[0, 1], [3, 0], [3, 1], [2, 4], [4, 4]], {0, 1, 2}),
    # No "000". State = number of trailing 0s.
    4: ([[1, 0], [2, 0], [3, 0], [3, 3]], {0, 1, 2}),
    # Even #0 and even #1. State = (#0 mod 2) + 2 (#1 mod 2).
    5: ([[1, 2], [0, 3], [3, 0], [2, 1]], {0}),
    # #0 - #1 = 0 mod 3. State = (#0 - #1) mod 3.
    6: ([[1, 2], [2, 0], [0, 1]], {0}),
    # 0*1*0*1*. State = index of the block being read.
    7: ([[0, 1], [2, 1], [2, 3], [4, 3], [4, 4]], {0, 1, 2, 3}),
}


class TomitaTask(DfaMembershipTask):
    """Tomita grammar `number` over {0, 1}: label 1 iff the string is in the language.

    Languages: 1 = 1*; 3 = no odd run of 1s followed by an odd run of 0s; 4 = no "000"; 5 = #0 and #1 both even;
    6 = #0 - #1 = 0 mod 3; 7 = 0*1*0*1*. Example (Tomita 4): "10010 -> no 000 -> class 1"; "10001 -> class 0".
    Sampling: `DfaMembershipTask` (half positives, half negatives, each uniform over its strings of the length).
    """

    def __init__(self, number: int) -> None:
        if number not in TOMITA_DFAS:
            raise ValueError(f"Tomita grammar {number!r} is not implemented; choose from {sorted(TOMITA_DFAS)}")
        transitions, accepting = TOMITA_DFAS[number]
        super().__init__(f"tomita_{number}", transitions, accepting)
