"""The statistics of the studies' tables: Student's t quantile, a gap's mean, SD and 95% interval
over held-out seeds, and decision rules declared before the runs (docs/EXPERIMENTS.md, section 6).

No scipy: the t quantile is a bisection on the t distribution's CDF, which is a regularized
incomplete beta function evaluated by its continued fraction (Numerical Recipes, betacf).
"""

from __future__ import annotations

import math
import operator
import re
import statistics
from dataclasses import dataclass
from typing import Callable

from spheretnorm.runtime.cli import UsageError

CONFIDENCE = 0.95
MIN_SEEDS_FOR_INTERVAL = 3  # with two values the interval (df 1, t = 12.7) says almost nothing; the table says so instead


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    # The continued fraction converges fast for x below (a + 1) / (a + b + 2); the symmetry
    # I_x(a, b) = 1 - I_{1-x}(b, a) gives the other side.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float, eps: float = 1e-15, most: int = 500) -> float:
    """The continued fraction of I_x(a, b) by the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, most + 1):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for p in (0, 1) and df > 0 (t(0.975, 4) = 2.776445)."""
    if not (0.0 < p < 1.0 and df > 0):
        raise ValueError(f"t_quantile needs p in (0, 1) and df > 0, got p={p} and df={df}.")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    return bisect(lambda t: t_cdf(t, df), p, low, high)


def bisect(rising: Callable[[float], float], target: float, low: float, high: float) -> float:
    """Where a function rising in x reaches target within [low, high], the bracket halved to float resolution."""
    for _ in range(200):  # halves the bracket to float resolution long before 200 steps
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        low, high = (mid, high) if rising(mid) < target else (low, mid)
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Spread:
    """Finite values over seeds: n, mean, SD (n - 1 in the denominator) and the 95% t-interval of the mean, None where too few."""

    n: int
    mean: float | None
    sd: float | None
    low: float | None
    high: float | None

    def interval_text(self, fmt: str = "+.3f") -> str:
        if self.low is None or self.high is None:
            return f"no interval ({self.n} seed{'s' if self.n != 1 else ''}; it needs {MIN_SEEDS_FOR_INTERVAL})"
        return f"{self.low:{fmt}} to {self.high:{fmt}}"


def spread(values: list[float]) -> Spread:
    """The Spread of finite values (the caller says what a non-finite one means: a failed run)."""
    n = len(values)
    mean = statistics.fmean(values) if values else None
    sd = statistics.stdev(values) if n >= 2 else None
    if n < MIN_SEEDS_FOR_INTERVAL or mean is None or sd is None:
        return Spread(n, mean, sd, None, None)
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return Spread(n, mean, sd, mean - half, mean + half)


# -----------------------------------------------------------------------------
# Decision rules: declared before the runs, printed with their verdict


# What a rule may bound, with its description; the one table of quantities the parser and the docs read.
RULE_QUANTITIES: dict[str, str] = {
    "every_gap": "every held-out seed's gap",
    "upper": "the upper end of the mean gap's 95% interval",
    "lower": "the lower end of the mean gap's 95% interval",
}
RULE_OPERATORS: dict[str, Callable[[float, float], bool]] = {"<": operator.lt, ">": operator.gt}
HOLDS, FAILS = "holds", "does not hold"
_RULE = re.compile(r"^\s*([a-z_]+)\s*([<>])\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Rule:
    """'every_gap<-0.02': a bound on a quantity of an arm's gaps to the baseline (arm minus baseline, held-out seeds)."""

    quantity: str
    op: str
    threshold: float

    @property
    def text(self) -> str:
        return f"{self.quantity}{self.op}{self.threshold:g}"

    def describe(self) -> str:
        return f"{RULE_QUANTITIES[self.quantity]} {'below' if self.op == '<' else 'above'} {self.threshold:g}"


def parse_rule(spec: str) -> Rule:
    """A rule from its text ('every_gap<-0.02', 'upper<0'); a bad one is a UsageError naming the valid forms."""
    match = _RULE.match(spec)
    if not match or match.group(1) not in RULE_QUANTITIES:
        raise UsageError(f"--rule {spec!r} is not a rule; give QUANTITY<NUMBER or QUANTITY>NUMBER with QUANTITY one of "
                         f"{', '.join(RULE_QUANTITIES)} (e.g. every_gap<-0.02).")
    return Rule(match.group(1), match.group(2), float(match.group(3)))


def verdict(rule: Rule, gaps: dict[int, float | None]) -> str:
    """What a rule says of an arm's held-out gaps ({seed: gap}): 'holds', 'does not hold' or
    'undecided (...)'. None is a run not there yet; +inf a seed where the arm failed (collapsed or
    diverged) and the baseline trained, -inf the other way round, nan both failed: a failed run
    counts as a loss for its side, never as a seed left out."""
    missing = [s for s, g in gaps.items() if g is None]
    if not gaps or missing:
        return f"undecided (runs missing: seed {', '.join(map(str, missing))})" if missing else "undecided (no held-out seeds)"
    values = [g for g in gaps.values() if g is not None]
    holds = RULE_OPERATORS[rule.op]
    if rule.quantity == "every_gap":
        return HOLDS if all(holds(g, rule.threshold) for g in values) else FAILS  # nan compares false: not held
    if not all(map(math.isfinite, values)):
        bound = statistics.fmean(values)  # +inf, -inf or nan (both sides failed somewhere): no interval, the failure decides
    else:
        s = spread(values)
        if s.low is None or s.high is None:
            return f"undecided (no interval: {s.n} held-out seeds, it needs {MIN_SEEDS_FOR_INTERVAL})"
        bound = s.high if rule.quantity == "upper" else s.low
    return HOLDS if holds(bound, rule.threshold) else FAILS


# -----------------------------------------------------------------------------
# Beside the rules (issue 63): an exact sign test over paired gaps, and a two-seed rule's power


def normal_cdf(z: float) -> float:
    """P(Z <= z) for a standard normal Z."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def sign_counts(gaps: list[float]) -> tuple[int, int]:
    """(negative, positive) among paired gaps; a gap of exactly 0 is a tie and counts in neither,
    as the sign test leaves ties out. A failed run's gap (+inf or -inf) counts by its sign."""
    return sum(1 for g in gaps if g < 0), sum(1 for g in gaps if g > 0)


def sign_test(wins: int, n: int) -> float:
    """The exact two-sided sign test: the chance, if each of n pairs' signs were a fair coin, of a split at least as
    lopsided as wins of n (twice the smaller binomial tail, at most 1; n without ties, sign_counts). n of n gives 2 * 0.5**n."""
    if n < 1 or not 0 <= wins <= n:
        raise ValueError(f"sign_test needs 0 <= wins <= n and n >= 1, got wins={wins} and n={n}.")
    fewer = min(wins, n - wins)
    tail = sum(math.comb(n, k) for k in range(fewer + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, j) * p ** j * (1.0 - p) ** (n - j) for j in range(k, n + 1))


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact two-sided interval for a binomial rate seen as k of n (failures among runs): the lowest rate under
    which k or more of n is still as likely as (1 - confidence) / 2, and the highest under which k or fewer is, each
    by bisection on its tail (monotone in the rate): 0 of 6 gives 0 to 1 - 0.025 ** (1 / 6) = 0.459."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"clopper_pearson needs 0 <= k <= n and n >= 1, got k={k} and n={n}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"clopper_pearson needs a confidence in (0, 1), got {confidence}.")
    alpha = (1.0 - confidence) / 2.0  # each tail rises in the rate p: the bound is where it reaches its target
    lower = 0.0 if k == 0 else bisect(lambda p: binomial_tail(k, n, p), alpha, 0.0, 1.0)  # P(X >= k) = alpha
    upper = 1.0 if k == n else bisect(lambda p: binomial_tail(k + 1, n, p), 1.0 - alpha, 0.0, 1.0)  # P(X <= k) = alpha
    return lower, upper


def every_gap_power(rule: Rule, true_gap: float, sd: float, n: int) -> float:
    """The chance that an every_gap rule ('every_gap>0.02') holds on n held-out seeds when each seed's gap is an
    independent normal draw (mean true_gap, known sd; a seed that fails is outside this model): Phi((true_gap - t) / sd) ** n
    for '>', Phi((t - true_gap) / sd) ** n for '<'."""
    if rule.quantity != "every_gap":
        raise ValueError(f"every_gap_power reads an every_gap rule, got {rule.text}.")
    if sd <= 0 or n < 1:
        raise ValueError(f"every_gap_power needs sd > 0 and n >= 1, got sd={sd} and n={n}.")
    z = (true_gap - rule.threshold) / sd if rule.op == ">" else (rule.threshold - true_gap) / sd
    return normal_cdf(z) ** n
