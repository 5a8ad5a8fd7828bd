"""D_n, the depth-bounded Dyck languages of Bhattamishra et al. (2020) used by RegularGPT."""
from regulargpt.tasks.base import DfaMembershipTask


class DyckTask(DfaMembershipTask):
    """D_0 = empty, D_n = (0 D_{n-1} 1)*: balanced strings of 0 = open, 1 = close with nesting depth <= n.

    D_1 = (01)*, D_2 = (0(01)*1)*, ... Example (n = 2): "001011 -> balanced, depth 2 -> class 1";
    "000111 -> depth 3 -> class 0"; "0110 -> closes below 0 -> class 0". Odd lengths have no members.
    The DFA tracks the depth: states 0..n, plus a dead state n+1 for closing at depth 0 or opening at depth n;
    accepting = {0}. Sampling: `DfaMembershipTask` (half positives, uniform over D_n at the length; half negatives,
    uniform over the rest).
    """

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"dyck: n must be an int >= 1, got {n!r}")
        dead = n + 1
        transitions = [[d + 1 if d < n else dead, d - 1 if d > 0 else dead] for d in range(n + 1)]
        super().__init__("dyck", [*transitions, [dead, dead]], {0})
        self.n = n
