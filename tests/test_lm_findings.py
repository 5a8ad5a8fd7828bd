"""The study's "What we found" lines, from hand-made result rows with hand-computed answers."""
from __future__ import annotations

from regulargpt.evaluation.lm_findings import findings_markdown, run_name, summarise


def _rows() -> list[dict]:
    """ppl at 64 → 2048 for seeds 0/1. ALiBi 100/100 → 100/100; the paper's RegularGPT 120/130 → 126/143 (ratios
    1.05/1.10); the same weights with depth=train 120/130 → 114/130 (0.95/1.00); a recency variant 108/110 → 108/110."""
    table = {("alibi", None): ((100, 100), (100, 100)), ("regular_gpt", None): ((120, 130), (126, 143)),
             ("regular_gpt", "train"): ((120, 130), (114, 130)), ("rg_recency", None): ((108, 110), (108, 110))}
    rows = []
    for (variant, policy), (short, long) in table.items():
        for seed in (0, 1):
            for length, ppl in ((64, short[seed]), (2048, long[seed])):
                rows.append({"run": f"results/x/runs/ds/{variant}-seed{seed}", "depth_policy": policy,
                             "dataset": "ds", "split": "test", "protocol": "nonoverlapping", "stride": length,
                             "tokens": 4096, "length": length, "ppl": float(ppl), "model": variant})
    return rows


def test_run_names() -> None:
    assert run_name("results/lm_cpu_v2/runs/debian-prose/rg_all-seed0") == ("rg_all", 0)
    assert run_name("runs/x") is None


def test_summaries_and_answers() -> None:
    table = summarise(_rows(), "ds")
    assert table[("regular_gpt", "train")].ratio(64, 2048) == [0.95, 1.0]
    assert table[("rg_recency", "adaptive")].paired(table[("alibi", "adaptive")], 64) == [
        108 / 100 - 1, 110 / 100 - 1]
    text = "\n".join(findings_markdown(_rows(), "ds", 64, 2048))
    # (a): regular_gpt / train (mean ratio 0.975) and rg_recency (1.000) are flat, the paper's adaptive is not
    # (1.075); (b): only rg_recency is within 10% (+9.0%); so rg_recency is the only one with both
    assert ("(a) Flat to 32×** (mean ppl(2048) / ppl(64) ≤ 1.00): regular_gpt / train (0.975), "
            "rg_recency / adaptive (1.000)") in text
    assert "(b) Within 10% of alibi at 1×**: rg_recency / adaptive (+9.0% ± 1.4)" in text
    assert "**Both at once**: rg_recency / adaptive" in text
    # the knob table: recency vs the paper at 1×: (108/120 − 1, 110/130 − 1) = (−10.0%, −15.4%) → −12.7% ± 3.8
    assert "| rg_recency | adaptive | -12.7% ± 3.8 |" in text
    # depth policy alone at 32×: (114/126 − 1, 130/143 − 1) = (−9.5%, −9.1%) → −9.3% ± 0.3
    assert "| regular_gpt (depth policy alone) | train vs adaptive | 0.0% ± 0.0 | -9.3% ± 0.3 |" in text


def test_position_gaps_are_paired_by_seed() -> None:
    from regulargpt.evaluation.lm_findings import position_gaps

    rows = []
    for variant, base in (("alibi", 3.0), ("regular_gpt", 3.5)):
        for seed in (0, 1):
            rows.append({"run": f"x/runs/ds/{variant}-seed{seed}", "dataset": "ds", "split": "test", "length": 64,
                         "protocol": "nonoverlapping", "stride": 64, "tokens": 64, "ppl": 1.0, "model": variant,
                         "per_position": [{"start": 0, "end": 1, "nll": base + seed, "tokens": 1},
                                          {"start": 1, "end": 2, "nll": base + 2 * seed, "tokens": 1}]})
    lines = position_gaps(rows, "ds", 64)
    assert lines[0] == "| variant | seeds | 0..0 | 1..1 |"
    assert lines[2] == "| regular_gpt | 2 | +0.500 | +0.500 |"
