"""The noise decision: effect size with a bootstrap interval, Mann–Whitney U, one-sample cases.

Each expectation is checked against scipy called directly or against exact arithmetic,
never against numbers copied from a previous run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from traceq.regression.check import parse_ratio, verdict
from traceq.regression.errors import RegressionError
from traceq.regression.stats import ALPHA, compare, min_p_value

# Six steps of a real kernel's time (ns), from trace_diff/control (ampere_sgemm_128x64_nn).
STEADY = np.array([582000, 581000, 581000, 582000, 583000, 581000], dtype=float)


def test_relative_change_is_the_ratio_of_means_and_lies_inside_its_interval() -> None:
    new = STEADY * 1.2
    (change,) = compare(STEADY[None, :], new[None, :])
    assert change.base == pytest.approx(STEADY.mean())
    assert change.rel == pytest.approx(new.mean() / STEADY.mean() - 1)
    assert change.ci_low is not None and change.ci_high is not None
    assert change.ci_low <= change.rel <= change.ci_high
    assert change.ci_low > 0.15  # every resample of 1.2x data is far above zero


def test_p_value_is_scipys_two_sided_mann_whitney() -> None:
    new = STEADY * 1.2
    (change,) = compare(STEADY[None, :], new[None, :])
    expected = sps.mannwhitneyu(STEADY, new, alternative="two-sided").pvalue
    assert change.p_value == pytest.approx(expected)
    assert change.significant


def test_separated_samples_without_ties_reach_the_exact_minimum_p_value() -> None:
    base = STEADY + np.arange(6)  # break the ties: the exact test applies
    (change,) = compare(base[None, :], base[None, :] * 1.2)
    assert change.p_value == pytest.approx(2 / math.comb(12, 6))
    assert change.p_value == pytest.approx(min_p_value(6, 6))


def test_a_shift_smaller_than_the_spread_is_inside_the_noise() -> None:
    rng = np.random.default_rng(7)
    base = 100.0 * (1 + rng.uniform(-0.3, 0.3, 6))
    new = base[::-1] * 1.05  # same spread, mean up 5%: well inside a ±30% jitter
    (change,) = compare(base[None, :], new[None, :])
    assert change.ci_low is not None and change.ci_high is not None
    assert change.ci_low < 0 < change.ci_high
    assert not change.significant
    assert verdict(change, 0.01) == "no change"


def test_identical_samples_are_no_change() -> None:
    (change,) = compare(STEADY[None, :], STEADY[None, :])
    assert change.rel == 0
    assert change.p_value == pytest.approx(1.0)
    assert verdict(change, 0.05) == "no change"


def test_rows_are_independent_metrics() -> None:
    base = np.vstack([STEADY, STEADY * 3])
    new = np.vstack([STEADY, STEADY * 3 * 0.5])
    same, halved = compare(base, new)
    assert same.rel == 0 and not same.significant
    assert halved.rel == pytest.approx(-0.5)
    assert verdict(halved, 0.05) == "improved"


def test_one_sample_decides_on_the_point_estimate_and_says_so() -> None:
    (change,) = compare(np.array([[1000.0]]), np.array([[1100.0]]))
    assert change.one_sample
    assert change.ci_low is None and change.p_value is None
    assert "one sample" in change.basis
    assert verdict(change, 0.05) == "regressed"
    assert verdict(change, 0.15) == "within limit"


# Three steps a side, 7.8 % slower in the mean: every resample's interval lies above zero,
# yet the fastest new step is only 1.9 % slower than the slowest base step.
THREE_BASE = np.array([100.0, 103.0, 106.0])
THREE_NEW = np.array([108.0, 111.0, 114.0])


def test_three_steps_each_are_too_few_to_judge_so_nothing_is_outside_the_noise() -> None:
    assert min_p_value(3, 3) == pytest.approx(0.1)
    assert min_p_value(6, 6) < ALPHA
    (change,) = compare(THREE_BASE[None, :], THREE_NEW[None, :])
    assert not change.test_can_decide and change.too_few
    assert change.ci_low is not None and change.ci_low > 0  # what used to decide alone
    assert change.significant is None  # neither outside nor inside: not judged
    assert change.judgement == "too few steps to judge (n=3; need ≥ 4)"
    assert "too few steps to judge (n=3; need ≥ 4)" in change.basis
    assert change.to_dict()["too_few_steps"] is True


def test_three_steps_with_a_small_slowdown_are_not_a_regression() -> None:
    (change,) = compare(THREE_BASE[None, :], THREE_NEW[None, :])
    assert change.rel == pytest.approx(111 / 103 - 1)  # beyond a 5 % limit in the mean
    assert change.pairs_low == pytest.approx(108 / 106 - 1)  # not on every step pair
    assert change.pairs_high == pytest.approx(114 / 100 - 1)
    assert verdict(change, 0.05) == "too few steps"


def test_three_steps_slower_beyond_the_limit_on_every_pair_still_regress() -> None:
    (slower,) = compare(STEADY[None, :3], STEADY[None, :3] * 1.3)
    assert slower.pairs_low == pytest.approx(STEADY[:3].min() * 1.3 / STEADY[:3].max() - 1)
    assert verdict(slower, 0.05) == "regressed"
    assert verdict(slower, 0.35) == "too few steps"  # 30 % is within a 35 % limit
    (faster,) = compare(STEADY[None, :3], STEADY[None, :3] * 0.7)
    assert verdict(faster, 0.05) == "improved"


def test_four_steps_each_are_judged_by_the_interval_and_the_test() -> None:
    """Enough steps for the U test: the mean decides against the noise, as before, even
    where not every step pair is beyond the limit (108 vs 103 is +4.9 %)."""
    (change,) = compare(np.array([[100.0, 101, 102, 103]]), np.array([[108.0, 109, 110, 111]]))
    assert change.test_can_decide and not change.too_few
    assert change.p_value == pytest.approx(min_p_value(4, 4))
    assert change.significant is True and change.judgement == "outside noise"
    assert change.pairs_low is not None and change.pairs_low < 0.05
    assert verdict(change, 0.05) == "regressed"
    assert change.to_dict()["too_few_steps"] is False


def test_groups_absent_on_one_side_appear_or_disappear() -> None:
    zeros = np.zeros(6)
    (appeared,) = compare(zeros[None, :], STEADY[None, :])
    (gone,) = compare(STEADY[None, :], zeros[None, :])
    assert appeared.rel is None and verdict(appeared, 0.05) == "appeared"
    assert gone.rel == -1 and verdict(gone, 0.05) == "disappeared"


@pytest.mark.parametrize(
    ("text", "ratio"), [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), (5, 0.05), (0.2, 0.2)]
)
def test_max_regress_accepts_percent_and_fraction(text: str | float, ratio: float) -> None:
    assert parse_ratio(text) == pytest.approx(ratio)


def test_max_regress_rejects_text_that_is_not_a_number() -> None:
    with pytest.raises(RegressionError, match="not a ratio"):
        parse_ratio("five percent")
    with pytest.raises(RegressionError, match="out of range"):
        parse_ratio(-0.05)
