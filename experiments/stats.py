"""The statistics of an experiment: per-arm metrics, effects with intervals, SRM and power.

Everything works on per-unit sufficient statistics (count, sums, sums of squares and of cross
products), so an analysis over millions of units is a handful of numbers per arm and the same code
serves the database-backed analysis, the simulations and the benchmark.

Conventions follow GrowthBook's engine (``gbstats``) so results can be checked against it:

- Ratio metrics (CTR = clicks / impressions, CVR = conversions / clicks, revenue per mille) are a
  ratio of sums over units; their per-unit variance comes from the delta method with sample
  (n - 1) variances and covariance (``RatioStats.variance``).
- The relative effect is ``(mean_b - mean_a) / mean_a`` with the delta-method variance
  ``var_b / (mean_a^2 n_b) + var_a mean_b^2 / (mean_a^4 n_a)``; the absolute effect is
  ``mean_b - mean_a`` with ``var_a / n_a + var_b / n_b``.
- p-values and intervals use Student's t with Welch-Satterthwaite degrees of freedom (for the
  sample sizes of an online experiment this is the z-test).
- Sequential (always-valid) intervals and p-values are the asymptotic confidence sequences of
  Waudby-Smith et al. (2023, eq. 9 and 155), a normal-mixture SPRT, with GrowthBook's tuning
  parameter (the total sample size at which the interval is tightest).
- CUPED uses one pooled ``theta = cov(post, pre) / var(pre)`` across arms.

Distributions come from scipy; only what scipy lacks (the delta method on sufficient
statistics, the confidence sequence) is written out here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_ALPHA = 0.05
DEFAULT_TUNING = 5000.0
# GrowthBook flags a sample-ratio mismatch below this p-value.
SRM_P_THRESHOLD = 0.001


# --- sufficient statistics ------------------------------------------------------------------


@dataclass(frozen=True)
class MeanStats:
    """Sufficient statistics of a per-unit value (e.g. clicks per user)."""

    n: float
    sum: float
    sum_squares: float

    @classmethod
    def from_values(cls, values: Sequence[float] | np.ndarray) -> MeanStats:
        x = np.asarray(values, dtype=float)
        return cls(n=float(x.size), sum=float(x.sum()), sum_squares=float((x * x).sum()))

    @property
    def mean(self) -> float:
        return self.sum / self.n if self.n else 0.0

    @property
    def variance(self) -> float:
        if self.n <= 1:
            return 0.0
        return (self.sum_squares - self.sum**2 / self.n) / (self.n - 1)


@dataclass(frozen=True)
class RatioStats:
    """Sufficient statistics of a ratio of per-unit sums (e.g. clicks / impressions)."""

    n: float
    sum_m: float
    sum_m2: float
    sum_d: float
    sum_d2: float
    sum_md: float

    @classmethod
    def from_units(cls, m: Sequence[float] | np.ndarray, d: Sequence[float] | np.ndarray):
        m = np.asarray(m, dtype=float)
        d = np.asarray(d, dtype=float)
        return cls(
            n=float(m.size),
            sum_m=float(m.sum()),
            sum_m2=float((m * m).sum()),
            sum_d=float(d.sum()),
            sum_d2=float((d * d).sum()),
            sum_md=float((m * d).sum()),
        )

    @property
    def mean(self) -> float:
        return self.sum_m / self.sum_d if self.sum_d else 0.0

    @property
    def variance(self) -> float:
        """Per-unit variance of the ratio by the delta method (multiply by 1/n for the mean's)."""
        n = self.n
        if n <= 1 or self.sum_d == 0:
            return 0.0
        mean_m, mean_d = self.sum_m / n, self.sum_d / n
        var_m = (self.sum_m2 - self.sum_m**2 / n) / (n - 1)
        var_d = (self.sum_d2 - self.sum_d**2 / n) / (n - 1)
        cov = (self.sum_md - self.sum_m * self.sum_d / n) / (n - 1)
        return var_m / mean_d**2 - 2 * cov * mean_m / mean_d**3 + mean_m**2 * var_d / mean_d**4


@dataclass(frozen=True)
class CupedStats:
    """A per-unit value with its pre-period covariate, adjusted with a pooled theta."""

    post: MeanStats
    pre: MeanStats
    sum_post_pre: float
    theta: float = 0.0

    @classmethod
    def from_values(cls, post, pre) -> CupedStats:
        post = np.asarray(post, dtype=float)
        pre = np.asarray(pre, dtype=float)
        return cls(
            post=MeanStats.from_values(post),
            pre=MeanStats.from_values(pre),
            sum_post_pre=float((post * pre).sum()),
        )

    @property
    def n(self) -> float:
        return self.post.n

    @property
    def covariance(self) -> float:
        n = self.n
        if n <= 1:
            return 0.0
        return (self.sum_post_pre - self.post.sum * self.pre.sum / n) / (n - 1)

    @property
    def mean(self) -> float:
        return self.post.mean - self.theta * self.pre.mean

    @property
    def unadjusted_mean(self) -> float:
        return self.post.mean

    @property
    def variance(self) -> float:
        return (
            self.post.variance
            + self.theta**2 * self.pre.variance
            - 2 * self.theta * (self.covariance)
        )

    def with_theta(self, theta: float) -> CupedStats:
        return CupedStats(self.post, self.pre, self.sum_post_pre, theta)


def cuped_theta(a: CupedStats, b: CupedStats) -> float:
    """The pooled regression coefficient of post on pre over both arms (0 without variance)."""
    n = a.n + b.n
    post = MeanStats(n, a.post.sum + b.post.sum, a.post.sum_squares + b.post.sum_squares)
    pre = MeanStats(n, a.pre.sum + b.pre.sum, a.pre.sum_squares + b.pre.sum_squares)
    if pre.variance <= 0 or post.variance <= 0:
        return 0.0
    cov = (a.sum_post_pre + b.sum_post_pre - post.sum * pre.sum / n) / (n - 1)
    return cov / pre.variance


# --- effects --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    """Treatment minus control: estimate, interval, p-value (relative or absolute)."""

    estimate: float
    ci_low: float
    ci_high: float
    p_value: float
    se: float
    dof: float
    relative: bool
    sequential: bool
    error: str = ""

    @property
    def significant(self) -> bool:
        return not self.error and (self.ci_low > 0 or self.ci_high < 0)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["significant"] = self.significant
        return {k: (_finite(v) if isinstance(v, float) else v) for k, v in out.items()}


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _unadjusted_mean(stat) -> float:
    return getattr(stat, "unadjusted_mean", stat.mean)


def effect_variance(a, b, *, relative: bool) -> float:
    """Variance of the difference in means (delta method for the relative one)."""
    if relative:
        mean_a, mean_b = _unadjusted_mean(a), _unadjusted_mean(b)
        return b.variance / (mean_a**2 * b.n) + a.variance * mean_b**2 / (mean_a**4 * a.n)
    return b.variance / b.n + a.variance / a.n


def welch_dof(a, b) -> float:
    va, vb = a.variance / a.n, b.variance / b.n
    denominator = va**2 / (a.n - 1) + vb**2 / (b.n - 1)
    return (va + vb) ** 2 / denominator if denominator > 0 else math.inf


def sequential_rho(alpha: float, tuning: float) -> float:
    """The mixture's spread, tuned to be tightest at ``tuning`` total units (eq. 161)."""
    return math.sqrt((-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / tuning)


def compare(
    a,
    b,
    *,
    alpha: float = DEFAULT_ALPHA,
    relative: bool = True,
    sequential: bool = False,
    tuning: float = DEFAULT_TUNING,
) -> Effect:
    """Compare treatment ``b`` with control ``a`` (MeanStats, RatioStats or CupedStats).

    CupedStats pairs get their pooled theta here. Degenerate inputs (no units, a zero control
    mean, no variance) give an uninformative result with ``error`` set, as gbstats does.
    """
    from scipy import stats as sps

    if isinstance(a, CupedStats) and isinstance(b, CupedStats):
        theta = cuped_theta(a, b)
        a, b = a.with_theta(theta), b.with_theta(theta)
    base = {"relative": relative, "sequential": sequential}
    if a.n < 2 or b.n < 2:
        return Effect(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, error="not enough units", **base)
    if relative and (a.mean == 0 or _unadjusted_mean(a) == 0):
        return Effect(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, error="control mean is zero", **base)
    if a.variance <= 0 or b.variance <= 0:
        return Effect(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, error="zero variance", **base)
    diff = b.mean - a.mean
    estimate = diff / _unadjusted_mean(a) if relative else diff
    variance = effect_variance(a, b, relative=relative)
    se = math.sqrt(variance)
    dof = welch_dof(a, b)
    if sequential:
        total = a.n + b.n
        rho = sequential_rho(alpha, tuning)
        nr2 = total * rho**2 + 1
        s2 = variance * total
        width = math.sqrt(s2) * math.sqrt(
            2 * nr2 * math.log(math.sqrt(nr2) / alpha) / (total * rho) ** 2
        )
        st2 = estimate**2 * total / variance
        log_evalue = rho**2 * st2 / (2 * nr2) - 0.5 * math.log(nr2)
        p_value = min(1.0, math.exp(-log_evalue)) if log_evalue > -700 else 1.0
    else:
        width = float(sps.t.ppf(1 - alpha / 2, dof)) * se
        p_value = float(2 * sps.t.sf(abs(estimate) / se, dof))
    return Effect(estimate, estimate - width, estimate + width, p_value, se, dof, **base)


# --- vectorised versions for simulations ------------------------------------------------------


def ratio_variance_arrays(n, sum_m, sum_m2, sum_d, sum_d2, sum_md):
    """``RatioStats.variance`` over numpy arrays of sufficient statistics."""
    mean_m, mean_d = sum_m / n, sum_d / n
    var_m = (sum_m2 - sum_m**2 / n) / (n - 1)
    var_d = (sum_d2 - sum_d**2 / n) / (n - 1)
    cov = (sum_md - sum_m * sum_d / n) / (n - 1)
    return var_m / mean_d**2 - 2 * cov * mean_m / mean_d**3 + mean_m**2 * var_d / mean_d**4


def relative_tests_arrays(
    a: Mapping[str, np.ndarray],
    b: Mapping[str, np.ndarray],
    *,
    alpha: float = DEFAULT_ALPHA,
    sequential: bool = False,
    tuning: float = DEFAULT_TUNING,
) -> dict[str, np.ndarray]:
    """Relative ratio-metric tests over arrays of sufficient statistics (one per simulation).

    ``a``/``b`` map n, sum_m, sum_m2, sum_d, sum_d2, sum_md to arrays of equal shape. Returns
    estimate, ci_low, ci_high, p_value and se arrays; the same formulas as ``compare``.
    """
    from scipy import stats as sps

    keys = ("n", "sum_m", "sum_m2", "sum_d", "sum_d2", "sum_md")
    var_a = ratio_variance_arrays(*(np.asarray(a[k], float) for k in keys))
    var_b = ratio_variance_arrays(*(np.asarray(b[k], float) for k in keys))
    n_a, n_b = np.asarray(a["n"], float), np.asarray(b["n"], float)
    mean_a = np.asarray(a["sum_m"], float) / np.asarray(a["sum_d"], float)
    mean_b = np.asarray(b["sum_m"], float) / np.asarray(b["sum_d"], float)
    estimate = (mean_b - mean_a) / mean_a
    variance = var_b / (mean_a**2 * n_b) + var_a * mean_b**2 / (mean_a**4 * n_a)
    se = np.sqrt(variance)
    if sequential:
        total = n_a + n_b
        rho = sequential_rho(alpha, tuning)
        nr2 = total * rho**2 + 1
        width = np.sqrt(variance * total) * np.sqrt(
            2 * nr2 * np.log(np.sqrt(nr2) / alpha) / (total * rho) ** 2
        )
        st2 = estimate**2 * total / variance
        p_value = np.minimum(1.0, np.exp(-(rho**2 * st2 / (2 * nr2) - 0.5 * np.log(nr2))))
    else:
        va, vb = var_a / n_a, var_b / n_b
        dof = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
        width = sps.t.ppf(1 - alpha / 2, dof) * se
        p_value = 2 * sps.t.sf(np.abs(estimate) / se, dof)
    return {
        "estimate": estimate,
        "ci_low": estimate - width,
        "ci_high": estimate + width,
        "p_value": p_value,
        "se": se,
    }


# --- SRM and power ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SrmResult:
    chi2: float
    p_value: float
    observed: list[float]
    expected: list[float]
    mismatch: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def srm_check(
    observed: Sequence[float], planned_weights: Sequence[float], *, threshold=SRM_P_THRESHOLD
) -> SrmResult:
    """Chi-square goodness of fit of the units per arm against the planned split."""
    from scipy import stats as sps

    obs = np.asarray(observed, dtype=float)
    weights = np.asarray(planned_weights, dtype=float)
    total = obs.sum()
    if total <= 0 or weights.sum() <= 0 or obs.size < 2:
        return SrmResult(0.0, 1.0, obs.tolist(), obs.tolist(), False)
    expected = weights / weights.sum() * total
    chi2, p_value = sps.chisquare(obs, expected)
    return SrmResult(
        float(chi2), float(p_value), obs.tolist(), expected.tolist(), bool(p_value < threshold)
    )


def relative_se(var_a: float, var_b: float, mean_a: float, mean_b: float, n_a, n_b) -> float:
    return math.sqrt(var_b / (mean_a**2 * n_b) + var_a * mean_b**2 / (mean_a**4 * n_a))


def power_relative(
    *,
    n_per_arm: float,
    unit_variance: float,
    mean: float,
    relative_lift: float,
    alpha: float = DEFAULT_ALPHA,
) -> float:
    """Power of the two-sided relative test for a lift, both arms with the control's variance
    scaled like the mean (the variance of a ratio metric grows with the square of its level)."""
    from scipy import stats as sps

    mean_b = mean * (1 + relative_lift)
    var_b = unit_variance * (1 + relative_lift) ** 2
    se = relative_se(unit_variance, var_b, mean, mean_b, n_per_arm, n_per_arm)
    z = sps.norm.ppf(1 - alpha / 2)
    shift = abs(relative_lift) / se
    return float(sps.norm.cdf(shift - z) + sps.norm.cdf(-shift - z))


def sample_size_per_arm(
    *,
    unit_variance: float,
    mean: float,
    relative_lift: float,
    alpha: float = DEFAULT_ALPHA,
    power: float = 0.8,
) -> int:
    """Units per arm for ``power`` at ``relative_lift`` (normal approximation, rounded up)."""
    from scipy import stats as sps

    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    # se^2 = c / n with c from the relative variance at n = 1
    c = (
        relative_se(
            unit_variance,
            unit_variance * (1 + relative_lift) ** 2,
            mean,
            mean * (1 + relative_lift),
            1,
            1,
        )
        ** 2
    )
    return math.ceil(c * z**2 / relative_lift**2)


# --- the analysis of an experiment ----------------------------------------------------------


@dataclass
class ArmData:
    """Per-unit totals of one arm (aligned arrays), with an optional pre-period covariate."""

    impressions: np.ndarray
    clicks: np.ndarray
    conversions: np.ndarray
    revenue: np.ndarray
    pre_clicks: np.ndarray | None = None

    @property
    def units(self) -> int:
        return int(self.impressions.size)

    def ratio(self, metric: str) -> RatioStats:
        if metric == "ctr":
            return RatioStats.from_units(self.clicks, self.impressions)
        if metric == "cvr":
            return RatioStats.from_units(self.conversions, self.clicks)
        if metric == "rpm":
            return RatioStats.from_units(self.revenue * 1000.0, self.impressions)
        raise ValueError(f"unknown metric {metric!r}")


METRICS = ("ctr", "cvr", "rpm")
METRIC_LABELS = {"ctr": "CTR", "cvr": "CVR", "rpm": "Revenue per mille"}


@dataclass(frozen=True)
class LookPlan:
    """Where this read-out stands in a group-sequential design: the information fractions of
    the looks so far, this one last (alpha is spent on this clock), optionally the information
    (units) seen at each (the looks' correlation), and the spending function."""

    fractions: tuple[float, ...]
    information: tuple[float, ...] | None = None
    spending: str = "obrien_fleming"

    def bounds(self, alpha: float) -> np.ndarray:
        return group_sequential_bounds(
            self.fractions, alpha=alpha, spending=self.spending, information=self.information
        )

    def as_dict(self, alpha: float) -> dict[str, Any]:
        bounds = self.bounds(alpha)
        return {
            "spending": self.spending,
            "look": len(self.fractions),
            "fractions": list(self.fractions),
            "information": list(self.information) if self.information else None,
            "bounds": [_finite(float(b)) for b in bounds],
            "alpha_spent": alpha_spent(self.fractions[-1], alpha, self.spending),
        }


def analyze(
    arms: Mapping[str, ArmData],
    *,
    control: str,
    planned_weights: Mapping[str, float],
    alpha: float = DEFAULT_ALPHA,
    tuning: float = DEFAULT_TUNING,
    cuped: bool = False,
    looks: LookPlan | None = None,
) -> dict[str, Any]:
    """The full read-out: per-arm totals and metrics, fixed and sequential effects of every
    treatment against control for every metric, optional CUPED on clicks per unit, and SRM.

    ``sequential`` is always the always-valid interval (readable at any moment; guardrails use
    it). With ``looks`` each metric also gets ``group_sequential``: the fixed-horizon effect
    judged against this look's alpha-spending boundary, which keeps the type-I error at alpha
    when the experiment is read at each of its planned looks; ``sequential_method`` names the
    one a decision should use."""
    from scipy import stats as sps

    out_arms: dict[str, Any] = {}
    plan = looks.as_dict(alpha) if looks is not None else None
    bound = plan["bounds"][-1] if plan is not None else None
    bound = math.inf if plan is not None and bound is None else bound
    z = float(sps.norm.ppf(1 - alpha / 2))
    for name, arm in arms.items():
        out_arms[name] = {
            "units": arm.units,
            "impressions": float(arm.impressions.sum()),
            "clicks": float(arm.clicks.sum()),
            "conversions": float(arm.conversions.sum()),
            "revenue": float(arm.revenue.sum()),
        }
        for metric in METRICS:
            ratio = arm.ratio(metric)
            half = z * math.sqrt(ratio.variance / ratio.n) if ratio.n > 1 else 0.0
            out_arms[name][metric] = ratio.mean
            # the arm's own interval (delta method), drawn as a band over time
            out_arms[name][f"{metric}_ci"] = [ratio.mean - half, ratio.mean + half]
    effects: dict[str, Any] = {}
    ctrl = arms[control]
    for name, arm in arms.items():
        if name == control:
            continue
        per_metric: dict[str, Any] = {}
        for metric in METRICS:
            a, b = ctrl.ratio(metric), arm.ratio(metric)
            fixed = compare(a, b, alpha=alpha)
            per_metric[metric] = {
                "relative": fixed.as_dict(),
                "absolute": compare(a, b, alpha=alpha, relative=False).as_dict(),
                "sequential": compare(a, b, alpha=alpha, sequential=True, tuning=tuning).as_dict(),
            }
            if bound is not None:
                per_metric[metric]["group_sequential"] = group_sequential_effect(fixed, bound)
        if cuped and ctrl.pre_clicks is not None and arm.pre_clicks is not None:
            a = CupedStats.from_values(ctrl.clicks, ctrl.pre_clicks)
            b = CupedStats.from_values(arm.clicks, arm.pre_clicks)
            per_metric["clicks_per_unit_cuped"] = {
                "relative": compare(a, b, alpha=alpha).as_dict(),
                "unadjusted": compare(a.post, b.post, alpha=alpha).as_dict(),
                "theta": cuped_theta(a, b),
            }
        effects[name] = per_metric
    names = list(arms)
    srm = srm_check([arms[n].units for n in names], [planned_weights.get(n, 0) for n in names])
    return {
        "control": control,
        "alpha": alpha,
        "tuning": tuning,
        "sequential_method": "group_sequential" if plan is not None else "always_valid",
        "group_sequential": plan,
        "arms": out_arms,
        "effects": effects,
        "srm": srm.as_dict(),
    }


# --- group-sequential boundaries (alpha spending) -------------------------------------------
#
# For experiments read at planned looks (e.g. daily) the always-valid interval above is
# conservative: it guards against any number of looks. A group-sequential design spends alpha
# over the planned looks instead (Lan & DeMets 1983), so reading at every look keeps the overall
# type-I error at alpha exactly. The boundaries come from the joint law of the z-statistics at
# the looks (a Brownian motion observed at the information fractions), integrated recursively as
# Armitage, McPherson & Rowe (1969) do: deterministic, no Monte Carlo. scipy and statsmodels
# have no group-sequential boundaries, so this is written here.

SPENDING_FUNCTIONS = ("obrien_fleming", "pocock")
SEQUENTIAL_METHODS = ("group_sequential", "always_valid")
_GRID = 801  # Simpson points per look over the continuation region


def alpha_spent(t: float | np.ndarray, alpha: float = DEFAULT_ALPHA, spending="obrien_fleming"):
    """Cumulative two-sided alpha spent by information fraction ``t`` (Lan-DeMets forms, each
    side spending half): O'Brien-Fleming-type ``2 (2 - 2 Phi(z_{alpha/4} / sqrt t))``,
    Pocock-type ``alpha ln(1 + (e - 1) t)``. Both spend all of alpha at ``t = 1``; the
    O'Brien-Fleming one gives the published K=5 bounds 4.877, 3.357, 2.680, 2.290, 2.031."""
    from scipy import stats as sps

    t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
    if spending == "obrien_fleming":
        with np.errstate(divide="ignore"):
            z = sps.norm.isf(alpha / 4) / np.sqrt(t)
        out = 4 * sps.norm.sf(z)
    elif spending == "pocock":
        out = alpha * np.log1p((math.e - 1) * t)
    else:
        raise ValueError(f"unknown spending function {spending!r}")
    return float(out) if out.ndim == 0 else out


def _simpson_weights(n: int, width: float) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * width / (3 * (n - 1))


class _Recursion:
    """The sub-density of the score B(t_k) on paths that have not crossed any earlier bound."""

    def __init__(self):
        self.t = 0.0
        self.x: np.ndarray | None = None  # grid of B(t_prev) inside the last bound
        self.f: np.ndarray | None = None  # sub-density times Simpson weights on that grid

    def exit_probability(self, t: float, bound: float) -> float:
        """P(no earlier crossing and |B(t)| >= bound), bound on the score scale."""
        from scipy import stats as sps

        sd = math.sqrt(t - self.t)
        if self.x is None:
            return float(2 * sps.norm.sf(bound / sd))
        tails = sps.norm.sf((bound - self.x) / sd) + sps.norm.cdf((-bound - self.x) / sd)
        return float(self.f @ tails)

    def advance(self, t: float, bound: float) -> None:
        from scipy import stats as sps

        sd = math.sqrt(t - self.t)
        x = np.linspace(-bound, bound, _GRID)
        w = _simpson_weights(_GRID, 2 * bound)
        if self.x is None:
            density = sps.norm.pdf(x / sd) / sd
        else:
            density = (sps.norm.pdf((x[:, None] - self.x[None, :]) / sd) / sd) @ self.f
        self.t, self.x, self.f = t, x, density * w


def _fractions(fractions: Sequence[float]) -> np.ndarray:
    t = np.asarray(fractions, dtype=float)
    if t.ndim != 1 or t.size == 0 or np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise ValueError("information fractions must be increasing and positive")
    return np.minimum(t, 1.0)


def group_sequential_bounds(
    fractions: Sequence[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    spending: str = "obrien_fleming",
    information: Sequence[float] | None = None,
) -> np.ndarray:
    """Two-sided z boundaries at looks with the given information fractions (last one 1 for a
    complete design), each spending ``alpha_spent(t_k) - alpha_spent(t_{k-1})``: rejecting when
    ``|z_k| >= c_k`` at any look has type-I error ``alpha_spent(t_K)``.

    ``information`` (e.g. units at each look) sets the looks' correlation
    ``sqrt(I_j / I_k)`` when alpha is spent on another clock (calendar time, Lan & DeMets 1989);
    by default it is the fractions themselves. Looks that spend nothing get an infinite bound.
    """
    from scipy.optimize import brentq

    t = _fractions(fractions)
    info = t if information is None else np.asarray(information, dtype=float)
    if info.shape != t.shape or np.any(info <= 0) or np.any(np.diff(info) <= 0):
        raise ValueError("information must be positive and increasing, one per look")
    info = info / info[-1]
    rec = _Recursion()
    bounds = np.full(t.size, math.inf)
    spent = 0.0
    for k, (tk, ik) in enumerate(zip(t, info, strict=True)):
        target = alpha_spent(tk, alpha, spending) - spent
        if target <= 1e-15:
            continue
        sd = math.sqrt(ik)

        def excess(c, ik=ik, sd=sd, target=target):
            return rec.exit_probability(ik, c * sd) - target

        bounds[k] = brentq(excess, 0.0, 40.0, xtol=1e-10)
        rec.advance(ik, bounds[k] * sd)
        spent += target
    return bounds


def crossing_probability(
    fractions: Sequence[float], bounds: Sequence[float], *, drift: float = 0.0
) -> float:
    """P(|z_k| >= c_k at some look) under no effect (``drift`` 0); for checking designs."""
    if drift:
        raise NotImplementedError("only the null is needed")
    t = _fractions(fractions)
    rec = _Recursion()
    total = 0.0
    for tk, c in zip(t, bounds, strict=True):
        if not math.isfinite(c):  # a look without a bound stops no path
            continue
        total += rec.exit_probability(tk, c * math.sqrt(tk))
        rec.advance(tk, c * math.sqrt(tk))
    return total


def pocock_constant(looks: int, *, alpha: float = DEFAULT_ALPHA) -> float:
    """Pocock's (1977) constant boundary for ``looks`` equally spaced looks."""
    from scipy.optimize import brentq

    t = np.arange(1, looks + 1) / looks
    return brentq(lambda c: crossing_probability(t, [c] * looks) - alpha, 1.0, 6.0, xtol=1e-10)


def group_sequential_effect(effect: Effect, bound: float) -> dict[str, Any]:
    """A fixed-horizon effect read at a look with boundary ``bound``: the repeated confidence
    interval ``estimate +- bound * se`` and whether it crossed (a two-sided z-test: at a look's
    sample size Student's t is the normal)."""
    from scipy import stats as sps

    out = effect.as_dict()
    if effect.error:
        out.update(bound=_finite(bound), sequential=True, significant=False)
        return out
    z = abs(effect.estimate) / effect.se if effect.se > 0 else 0.0
    half = bound * effect.se if math.isfinite(bound) else math.inf
    out.update(
        ci_low=_finite(effect.estimate - half),
        ci_high=_finite(effect.estimate + half),
        p_value=float(2 * sps.norm.sf(z)),
        bound=_finite(bound),
        sequential=True,
        significant=bool(z >= bound),
    )
    return out
