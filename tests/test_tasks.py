"""The regular-language tasks against brute-force definitions written independently of the implementation."""
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from regulargpt.tasks import TASK_NAMES, Task, make_task


def tomita_3(s: str) -> bool:
    """No odd-length run of 1s immediately followed by an odd-length run of 0s."""
    runs = [(symbol, len(list(group))) for symbol, group in itertools.groupby(s)]
    return not any(a == "1" and la % 2 and b == "0" and lb % 2 for (a, la), (b, lb) in zip(runs, runs[1:]))


def dyck_by_deletion(s: str, n: int) -> bool:
    """D_n: the string empties after at most n rounds of deleting every "01"."""
    for _ in range(n):
        s = s.replace("01", "")
    return s == ""


def dyck_regex(n: int) -> str:
    """D_0 = empty, D_n = (0 D_{n-1} 1)*."""
    inner = ""
    for _ in range(n):
        inner = f"(?:0{inner}1)*"
    return inner


def full(pattern: str) -> Callable[[str], bool]:
    return lambda s: re.fullmatch(pattern, s) is not None


# id -> (task name, options, alphabet size, brute-force label of a string over "0", "1", "2")
BRUTE: dict[str, tuple[str, dict[str, int | float], int, Callable[[str], int | bool]]] = {
    "even_pairs": ("even_pairs", {}, 2, lambda s: sum(a != b for a, b in zip(s, s[1:])) % 2),
    "parity_check": ("parity_check", {"p_one": 0.5}, 2, lambda s: s.count("1") % 2),
    "cycle_navigation": ("cycle_navigation", {}, 3, lambda s: sum(int(c) - 1 for c in s) % 5),
    "tomita_1": ("tomita_1", {}, 2, full("1*")),
    "tomita_3": ("tomita_3", {}, 2, tomita_3),
    "tomita_4": ("tomita_4", {}, 2, lambda s: "000" not in s),
    "tomita_5": ("tomita_5", {}, 2, lambda s: s.count("0") % 2 == 0 and s.count("1") % 2 == 0),
    "tomita_6": ("tomita_6", {}, 2, lambda s: (s.count("0") - s.count("1")) % 3 == 0),
    "tomita_7": ("tomita_7", {}, 2, full("0*1*0*1*")),
    **{f"dyck_{n}": ("dyck", {"n": n}, 2, full(dyck_regex(n))) for n in (1, 2, 3, 4, 12)},
    "aa_star": ("aa_star", {}, 1, full("(00)*")),
    "aaaa_star": ("aaaa_star", {}, 1, full("(0000)*")),
    "abab_star": ("abab_star", {}, 2, full("(0101)*")),
}
MEMBERSHIP = [key for key, (name, *_) in BRUTE.items() if name.startswith(("tomita", "dyck")) or "star" in name]

# Which lengths have members / non-members, stated from the definitions (checked by enumeration below).
HAS_MEMBER: dict[str, Callable[[int], bool]] = {
    "tomita_1": lambda t: True, "tomita_3": lambda t: True, "tomita_4": lambda t: True,
    "tomita_5": lambda t: t % 2 == 0, "tomita_6": lambda t: t != 1, "tomita_7": lambda t: True,
    **{f"dyck_{n}": (lambda t: t % 2 == 0) for n in (1, 2, 3, 4, 12)},
    "aa_star": lambda t: t % 2 == 0, "aaaa_star": lambda t: t % 4 == 0, "abab_star": lambda t: t % 4 == 0,
}
HAS_NON_MEMBER: dict[str, Callable[[int], bool]] = {
    "tomita_1": lambda t: True, "tomita_3": lambda t: t >= 2, "tomita_4": lambda t: t >= 3,
    "tomita_5": lambda t: True, "tomita_6": lambda t: True, "tomita_7": lambda t: t >= 4,  # "1010"
    **{f"dyck_{n}": (lambda t: True) for n in (1, 2, 3, 4, 12)},
    "aa_star": lambda t: t % 2 == 1, "aaaa_star": lambda t: t % 4 != 0, "abab_star": lambda t: True,
}


def build(key: str) -> Task:
    name, options, _, _ = BRUTE[key]
    return make_task(name, **options)


def as_strings(inputs: torch.Tensor) -> list[str]:
    return ["".join(map(str, row)) for row in inputs.tolist()]


def all_strings(alphabet: int, length: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(alphabet), repeat=length)), dtype=torch.long)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_task_names_and_shapes() -> None:
    assert TASK_NAMES == (
        "even_pairs", "parity_check", "cycle_navigation", "modular_arithmetic", "tomita_1", "tomita_3", "tomita_4",
        "tomita_5", "tomita_6", "tomita_7", "dyck", "aa_star", "aaaa_star", "abab_star",
    )
    expected = {"even_pairs": (2, 2), "parity_check": (2, 2), "cycle_navigation": (3, 5), "aa_star": (1, 2)}
    for key, (name, _, alphabet, _) in BRUTE.items():
        task = build(key)
        assert task.name == name
        assert (task.input_vocab_size, task.num_classes) == expected.get(name, (alphabet, 2))
        assert task.is_membership == (key in MEMBERSHIP)
    for m in (3, 5):
        task = make_task("modular_arithmetic", modulus=m)
        assert (task.input_vocab_size, task.num_classes, task.is_membership) == (m + 3, m, False)


@pytest.mark.parametrize("key", list(BRUTE))
def test_label_matches_brute_force_on_all_short_strings(key: str) -> None:
    task, (_, options, alphabet, brute) = build(key), BRUTE[key]
    for length in range(1, 11):
        inputs = all_strings(alphabet, length)  # (A^T, T)
        expected = [int(brute(s)) for s in as_strings(inputs)]
        assert task.label(inputs).tolist() == expected, (key, length)
        if key.startswith("dyck"):
            assert expected == [int(dyck_by_deletion(s, options["n"])) for s in as_strings(inputs)]


@pytest.mark.parametrize("key", list(BRUTE))
def test_samples_are_labelled_correctly_at_long_lengths(key: str) -> None:
    task, (_, _, alphabet, brute) = build(key), BRUTE[key]
    for length in (41, 97, 256, 500):
        inputs, labels = task.sample(32, length, gen(length))
        assert inputs.shape == (32, length) and labels.shape == (32,)
        assert inputs.dtype == labels.dtype == torch.long
        assert 0 <= int(inputs.min()) and int(inputs.max()) < alphabet
        assert labels.tolist() == [int(brute(s)) for s in as_strings(inputs)], (key, length)


@pytest.mark.parametrize("key", MEMBERSHIP)
def test_membership_rules_for_short_lengths(key: str) -> None:
    """The HAS_MEMBER / HAS_NON_MEMBER tables used below agree with enumeration."""
    _, _, alphabet, brute = BRUTE[key]
    for length in range(1, 11):
        found = {bool(brute(s)) for s in as_strings(all_strings(alphabet, length))}
        assert (True in found, False in found) == (HAS_MEMBER[key](length), HAS_NON_MEMBER[key](length))


@pytest.mark.parametrize("key", MEMBERSHIP)
def test_membership_batches_are_balanced(key: str) -> None:
    task, brute = build(key), BRUTE[key][3]
    for length in (1, 2, 3, 4, 5, 6, 8, 12, 40, 101, 200):
        inputs, labels = task.sample(2000, length, gen(length))
        positive = labels.float().mean().item()
        if HAS_MEMBER[key](length) and HAS_NON_MEMBER[key](length):
            assert int(labels.sum()) == 1000, (key, length, positive)  # exactly half: batch_size // 2 positives
        else:
            assert positive == float(HAS_MEMBER[key](length)), (key, length)
        if length <= 12:  # negatives are rejected strings, positives accepted ones
            assert labels.tolist() == [int(brute(s)) for s in as_strings(inputs)]


@pytest.mark.parametrize(("key", "length"), [("tomita_3", 6), ("tomita_7", 6), ("dyck_2", 8), ("tomita_6", 5)])
def test_membership_samples_are_uniform_within_each_class(key: str, length: int) -> None:
    task, brute = build(key), BRUTE[key][3]
    inputs, labels = task.sample(6000, length, gen(0))
    strings = as_strings(inputs)
    for cls in (0, 1):
        support = {s for s in as_strings(all_strings(2, length)) if int(brute(s)) == cls}
        counts = Counter(s for s, y in zip(strings, labels.tolist()) if y == cls)
        assert set(counts) == support
        expected = sum(counts.values()) / len(support)
        chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
        dof = len(support) - 1
        assert chi2 < dof + 6 * math.sqrt(2 * dof), (key, cls, chi2, dof)


@pytest.mark.parametrize("p_one", [0.2, 0.5, 0.8])
def test_parity_p_one_sets_the_fraction_of_ones(p_one: float) -> None:
    inputs, _ = make_task("parity_check", p_one=p_one).sample(1000, 100, gen(1))
    assert abs(inputs.float().mean().item() - p_one) < 0.01


def encode(expression: str, m: int) -> list[int]:
    return [int(c) if c.isdigit() else m + "+-*".index(c) for c in expression]


def decode(row: list[int], m: int) -> str:
    return "".join(str(v) if v < m else "+-*"[v - m] for v in row)


def expressions(m: int, length: int) -> list[str]:
    digits, ops = [str(d) for d in range(m)], "+-*"
    out = []
    for ds in itertools.product(digits, repeat=(length + 1) // 2):
        for os_ in itertools.product(ops, repeat=length // 2):
            out.append(ds[0] + "".join(o + d for o, d in zip(os_, ds[1:])))
    return out


@pytest.mark.parametrize(("m", "leading_plus", "max_length"),
                         [pytest.param(3, False, 9, marks=pytest.mark.slow), (5, False, 7), (5, True, 7)])
def test_modular_arithmetic_label_matches_python_eval(m: int, leading_plus: bool, max_length: int) -> None:
    task = make_task("modular_arithmetic", modulus=m, leading_plus=leading_plus)
    prefix = "+" if leading_plus else ""
    for length in range(1, max_length + 1, 2):
        exprs = [prefix + e for e in expressions(m, length)]
        inputs = torch.tensor([encode(e, m) for e in exprs])
        assert task.label(inputs).tolist() == [eval(e) % m for e in exprs], length  # Python: * before +, -


def test_modular_arithmetic_hand_worked_examples() -> None:
    cases = {"2+3*4": 4, "1-2*3": 0, "1+2*3": 2, "1-1-1": 4, "0*1+4*3-2": 0, "4*4*4": 4, "3": 3, "2-4": 3}
    task = make_task("modular_arithmetic")
    for expression, value in cases.items():
        assert task.label(torch.tensor([encode(expression, 5)])).item() == value, expression
    assert make_task("modular_arithmetic", modulus=3).label(torch.tensor([encode("2*2+1", 3)])).item() == 2


@pytest.mark.parametrize("m", [3, 5])
def test_modular_arithmetic_samples_lengths_and_labels(m: int) -> None:
    task = make_task("modular_arithmetic", modulus=m)
    plus = make_task("modular_arithmetic", modulus=m, leading_plus=True)
    for length in (41, 42, 97, 500, 5, 6):  # several lengths in one process (the upstream generator bug)
        inputs, labels = task.sample(64, length, gen(length))
        assert inputs.shape == (64, length - (length % 2 == 0))
        strings = [decode(row, m) for row in inputs.tolist()]
        assert labels.tolist() == [eval(s) % m for s in strings]
        assert set("".join(strings)) == set("+-*") | {str(d) for d in range(m)}
        with_plus, plus_labels = plus.sample(64, length, gen(length))
        assert with_plus.shape == (64, length + (length % 2 == 1))
        assert (with_plus[:, 0] == m).all() and torch.equal(with_plus[:, 1:], inputs)
        assert torch.equal(plus_labels, labels)


@pytest.mark.parametrize("key", list(BRUTE))
def test_sampling_is_deterministic_given_the_generator(key: str) -> None:
    task = build(key)
    first, second, other = (task.sample(16, 30, gen(seed)) for seed in (7, 7, 8))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    if BRUTE[key][2] > 1:
        assert not torch.equal(first[0], other[0])


def test_modular_arithmetic_is_deterministic() -> None:
    task = make_task("modular_arithmetic", modulus=5)
    a, b = task.sample(16, 31, gen(3)), task.sample(16, 31, gen(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"'parity'.*Did you mean 'parity_check'.*even_pairs"):
        make_task("parity")
    with pytest.raises(ValueError, match=r"'tomita_2'.*tomita_1"):
        make_task("tomita_2")
    with pytest.raises(ValueError, match=r"\bp\b.*p_one"):
        make_task("parity_check", p=0.3)
    with pytest.raises(ValueError, match=r"modulo.*modulus, leading_plus"):
        make_task("modular_arithmetic", modulo=3)
    with pytest.raises(ValueError, match=r"n.*none"):
        make_task("tomita_3", n=2)
    with pytest.raises(ValueError, match=r"requires.*\bn\b"):
        make_task("dyck")
    for name, options in [
        ("dyck", {"n": 0}), ("parity_check", {"p_one": 1.0}), ("parity_check", {"p_one": 0}),
        ("modular_arithmetic", {"modulus": 1}), ("modular_arithmetic", {"modulus": 5.0}),
    ]:
        with pytest.raises(ValueError):
            make_task(name, **options)
    for key in ("even_pairs", "dyck_2", "aa_star"):
        with pytest.raises(ValueError, match="length"):
            build(key).sample(4, 0, gen(0))
    with pytest.raises(ValueError, match="token ids"):
        build("aa_star").label(torch.ones((1, 4), dtype=torch.long))
    with pytest.raises(ValueError, match="alternate"):
        make_task("modular_arithmetic").label(torch.tensor([encode("1+2", 5)[:2]]))
