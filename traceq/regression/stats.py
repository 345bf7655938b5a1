"""Is a difference real? Per-step samples in, effect size with its interval and a p-value out.

Step times jitter by a few percent from run to run, so a check that compares two means
fails on noise. With several steps per trace, each metric is decided like asv does for
benchmarks: the relative change of the per-step means with a bootstrap confidence interval
(the effect size and its uncertainty), and a Mann–Whitney U test over the per-step samples
(no normality assumed). A change counts only when the interval excludes zero and the test
rejects "same distribution". With so few steps that the test cannot reach its level
(3 + 3 steps give at best p = 0.1) nothing is called outside the noise: an interval from
three numbers per side is no estimate of it. Such a change says "too few steps to judge",
and carries the range every step pair's change lies in (`pairs_low`, `pairs_high`), the
one thing three steps do show for sure (the gate fails on it). With one sample on a side
there is no noise estimate: the point estimate decides, and the result says so.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 20240601  # fixed: the same traces always give the same interval


@dataclass(frozen=True)
class Change:
    """The change of one metric: per-step means (or totals), relative change `rel`
    (None when the base is zero), its interval, the test's p-value and the sample sizes."""

    base: float
    new: float
    rel: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n_base: int
    n_new: int
    # Every step pair's change, new step / base step - 1, lies in [pairs_low, pairs_high]:
    # the fastest new step against the slowest base step, and the reverse. None without
    # steps on both sides or when a base step took no time.
    pairs_low: float | None = None
    pairs_high: float | None = None

    @property
    def delta(self) -> float:
        return self.new - self.base

    @property
    def one_sample(self) -> bool:
        return min(self.n_base, self.n_new) < 2

    @property
    def test_can_decide(self) -> bool:
        """Whether Mann–Whitney U can reach p < ALPHA at all with these sample sizes."""
        return not self.one_sample and min_p_value(self.n_base, self.n_new) < ALPHA

    @property
    def too_few(self) -> bool:
        """Too few steps to judge: more than one on each side, but too few for the U test to
        reach its level (3 + 3 steps give at best p = 0.1), so "outside the noise" would
        rest on an interval from three numbers."""
        return not self.one_sample and not self.test_can_decide

    @property
    def too_few_text(self) -> str:
        """'too few steps to judge (n=3; need ≥ 4)'."""
        n = min(self.n_base, self.n_new)
        return f"too few steps to judge (n={n}; need ≥ {min_steps()})"

    @property
    def significant(self) -> bool | None:
        """Outside the noise: the interval excludes 0 and the test rejects. None when there
        are too few steps to judge: neither "outside" nor "inside" the noise can be said,
        and saying either (from an interval of three numbers) misleads a reader."""
        if self.rel is None:
            return self.new != self.base
        if self.one_sample:
            return self.rel != 0
        if self.too_few:
            return None
        if self.ci_low is None or self.ci_high is None:
            return False
        outside = self.ci_low > 0 or self.ci_high < 0
        return outside and self.p_value is not None and self.p_value < ALPHA

    @property
    def judgement(self) -> str:
        """The verdict on the noise in words: what diff's totals and check's notes print."""
        if self.one_sample:
            return "one sample: no noise estimate"
        if self.too_few and self.rel is not None:
            return self.too_few_text
        return "outside noise" if self.significant else "no change (inside noise)"

    @property
    def basis(self) -> str:
        """How the decision was made, in words a reader of the report can check."""
        if self.one_sample:
            return "one sample: no noise estimate, the decision rests on one measurement"
        if not self.test_can_decide:
            return (
                f"{self.n_base}+{self.n_new} steps, {self.too_few_text}: the U test cannot "
                f"reach p < {ALPHA}, so only a change beyond the limit on every step pair "
                "is decided"
            )
        return f"{self.n_base}+{self.n_new} steps: bootstrap interval and Mann–Whitney U"

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return {
            "base": self.base,
            "new": self.new,
            "delta": self.delta,
            "rel": self.rel,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "p_value": self.p_value,
            "n_base": self.n_base,
            "n_new": self.n_new,
            "significant": self.significant,
            "too_few_steps": self.too_few,
            "pairs_low": self.pairs_low,
            "pairs_high": self.pairs_high,
        }


def min_steps() -> int:
    """The fewest steps a side needs (both sides equal) for the U test to reach `ALPHA`."""
    return next(n for n in range(2, 64) if min_p_value(n, n) < ALPHA)


def min_p_value(n: int, m: int) -> float:
    """Smallest two-sided exact Mann–Whitney p-value for samples of sizes n and m."""
    return min(1.0, 2.0 / math.comb(n + m, n))


def compare(base: np.ndarray, new: np.ndarray) -> list[Change]:
    """One `Change` per row of `base` (G, n) and `new` (G, m): samples of G metrics."""
    base = np.atleast_2d(np.asarray(base, dtype=float))
    new = np.atleast_2d(np.asarray(new, dtype=float))
    if base.shape[0] != new.shape[0]:
        raise ValueError("base and new must hold the same metrics (rows)")
    base_mean, new_mean = base.mean(axis=1), new.mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(base_mean > 0, new_mean / base_mean - 1.0, np.nan)
    low = np.full(len(rel), np.nan)
    high = np.full(len(rel), np.nan)
    n, m = base.shape[1], new.shape[1]
    noisy = (base_mean > 0) & (min(n, m) >= 2)
    if noisy.any():
        low[noisy], high[noisy] = _bootstrap(base[noisy], new[noisy])
    p_values = np.full(len(rel), np.nan)
    if min(n, m) >= 2:
        for i in np.flatnonzero(base_mean > 0):
            p_values[i] = _mann_whitney(base[i], new[i])
    pairs_low, pairs_high = _pairs(base, new)
    return [
        Change(
            base=float(base_mean[i]),
            new=float(new_mean[i]),
            rel=_opt(rel[i]),
            ci_low=_opt(low[i]),
            ci_high=_opt(high[i]),
            p_value=_opt(p_values[i]),
            n_base=n,
            n_new=m,
            pairs_low=_opt(pairs_low[i]),
            pairs_high=_opt(pairs_high[i]),
        )
        for i in range(len(rel))
    ]


def _pairs(base: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the smallest and largest change of any step pair: min(new) / max(base) - 1
    and max(new) / min(base) - 1 (NaN where a base step took no time)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        low = np.where(base.max(axis=1) > 0, new.min(axis=1) / base.max(axis=1) - 1.0, np.nan)
        high = np.where(base.min(axis=1) > 0, new.max(axis=1) / base.min(axis=1) - 1.0, np.nan)
    return low, high


def _bootstrap(base: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of mean(new) / mean(base) - 1, all rows at once."""
    from scipy import stats

    def relative(b: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return x.mean(axis=axis) / b.mean(axis=axis) - 1.0

    with warnings.catch_warnings():
        # Constant samples (a kernel that takes exactly as long every step) are degenerate
        # for the bootstrap; their interval is the point itself, which is what we want.
        warnings.simplefilter("ignore")
        result = stats.bootstrap(
            (base, new),
            relative,
            n_resamples=RESAMPLES,
            vectorized=True,
            axis=-1,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(SEED),
        )
    interval = result.confidence_interval
    return np.asarray(interval.low, dtype=float), np.asarray(interval.high, dtype=float)


def _mann_whitney(base: np.ndarray, new: np.ndarray) -> float:
    from scipy import stats

    if np.all(base == base[0]) and np.all(new == base[0]):
        return 1.0  # identical constant samples: no difference at all
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = stats.mannwhitneyu(base, new, alternative="two-sided")
    return float(result.pvalue)


def _opt(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)
