"""Vectorised experiment simulations: A/A false-positive rates (with and without daily peeking)
and the power of a planned sample size, used by the tests and the benchmark.

A simulated unit sees ``1 + Poisson(mean_impressions - 1)`` impressions and has its own
click-through rate drawn from a Beta around the arm's CTR (users differ), so clicks are
over-dispersed the way real per-user data is and the delta method has real work to do. Only the
per-unit sufficient statistics are kept, summed per simulation (and per day for peeking), so
thousands of experiments take a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from experiments import stats

KEYS = ("n", "sum_m", "sum_m2", "sum_d", "sum_d2", "sum_md")


@dataclass(frozen=True)
class Population:
    ctr: float = 0.1
    mean_impressions: float = 10.0
    concentration: float = 20.0  # Beta(a, b) with a + b = concentration

    def draw(self, rng: np.random.Generator, shape, lift: float = 0.0):
        """Per-unit (clicks, impressions) arrays of ``shape``."""
        imps = 1 + rng.poisson(self.mean_impressions - 1, size=shape)
        ctr = self.ctr * (1 + lift)
        p = rng.beta(ctr * self.concentration, (1 - ctr) * self.concentration, size=shape)
        clicks = rng.binomial(imps, p)
        return clicks.astype(float), imps.astype(float)

    def unit_variance(self, rng: np.random.Generator, units: int = 400_000) -> float:
        """The delta-method per-unit variance of CTR, from a large pilot sample."""
        clicks, imps = self.draw(rng, (units,))
        return stats.RatioStats.from_units(clicks, imps).variance


def _sums(clicks: np.ndarray, imps: np.ndarray) -> dict[str, np.ndarray]:
    """Sufficient statistics summed over the last axis."""
    return {
        "n": np.full(clicks.shape[:-1], clicks.shape[-1], dtype=float),
        "sum_m": clicks.sum(-1),
        "sum_m2": (clicks * clicks).sum(-1),
        "sum_d": imps.sum(-1),
        "sum_d2": (imps * imps).sum(-1),
        "sum_md": (clicks * imps).sum(-1),
    }


def simulate_arms(
    rng: np.random.Generator,
    population: Population,
    *,
    sims: int,
    units_per_arm: int,
    lift: float = 0.0,
    days: int = 1,
    chunk: int = 100,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Cumulative sufficient statistics of control and treatment, shape (sims, days)."""
    per_day = units_per_arm // days
    out_a = {k: np.zeros((sims, days)) for k in KEYS}
    out_b = {k: np.zeros((sims, days)) for k in KEYS}
    for start in range(0, sims, chunk):
        stop = min(sims, start + chunk)
        shape = (stop - start, days, per_day)
        for out, arm_lift in ((out_a, 0.0), (out_b, lift)):
            sums = _sums(*population.draw(rng, shape, lift=arm_lift))
            for k in KEYS:
                out[k][start:stop] = np.cumsum(sums[k], axis=1)
    return out_a, out_b


def aa_false_positive_rates(
    *,
    sims: int = 1000,
    units_per_arm: int = 2000,
    days: int = 14,
    alpha: float = 0.05,
    tuning: float | None = None,
    population: Population | None = None,
    seed: int = 7,
) -> dict[str, float]:
    """Share of A/A experiments declared significant: at the end with the fixed-horizon test,
    at any daily peek with the fixed test (the inflation peeking causes), at any daily peek
    with the group-sequential test (O'Brien-Fleming- and Pocock-type alpha spending over the
    planned daily looks: ``group_sequential_peeking`` and ``..._pocock``) and with the
    always-valid interval (``sequential_peeking``). ``tuning`` defaults to the final total
    sample size."""
    rng = np.random.default_rng(seed)
    population = population or Population()
    a, b = simulate_arms(rng, population, sims=sims, units_per_arm=units_per_arm, days=days)
    total = 2 * (units_per_arm // days) * days
    fixed = stats.relative_tests_arrays(a, b, alpha=alpha)
    seq = stats.relative_tests_arrays(
        a, b, alpha=alpha, sequential=True, tuning=tuning or float(total)
    )
    fixed_sig = fixed["p_value"] < alpha
    seq_sig = (seq["ci_low"] > 0) | (seq["ci_high"] < 0)
    # the days are the planned looks, equally spaced in units (information)
    fractions = np.arange(1, days + 1) / days
    z = np.abs(fixed["estimate"]) / fixed["se"]
    gs = {
        spending: (z >= stats.group_sequential_bounds(fractions, alpha=alpha, spending=spending))
        for spending in stats.SPENDING_FUNCTIONS
    }
    return {
        "fixed_final": float(fixed_sig[:, -1].mean()),
        "fixed_peeking": float(fixed_sig.any(axis=1).mean()),
        "group_sequential_peeking": float(gs["obrien_fleming"].any(axis=1).mean()),
        "group_sequential_peeking_pocock": float(gs["pocock"].any(axis=1).mean()),
        "sequential_peeking": float(seq_sig.any(axis=1).mean()),
        "sequential_pvalue_peeking": float((seq["p_value"] < alpha).any(axis=1).mean()),
    }


def power_check(
    *,
    relative_lift: float = 0.03,
    target_power: float = 0.8,
    sims: int = 1000,
    alpha: float = 0.05,
    population: Population | None = None,
    seed: int = 11,
) -> dict[str, float]:
    """Plan the sample size for ``target_power`` at ``relative_lift`` from a pilot variance,
    then simulate that many units per arm and count how often the lift is detected."""
    rng = np.random.default_rng(seed)
    population = population or Population()
    variance = population.unit_variance(rng)
    n = stats.sample_size_per_arm(
        unit_variance=variance,
        mean=population.ctr,
        relative_lift=relative_lift,
        alpha=alpha,
        power=target_power,
    )
    promised = stats.power_relative(
        n_per_arm=n,
        unit_variance=variance,
        mean=population.ctr,
        relative_lift=relative_lift,
        alpha=alpha,
    )
    a, b = simulate_arms(
        rng,
        population,
        sims=sims,
        units_per_arm=n,
        lift=relative_lift,
        chunk=max(1, 2_000_000 // n),
    )
    result = stats.relative_tests_arrays(a, b, alpha=alpha)
    detected = (result["p_value"][:, -1] < alpha) & (result["estimate"][:, -1] > 0)
    return {
        "units_per_arm": float(n),
        "power_promised": float(promised),
        "power_observed": float(detected.mean()),
        "unit_variance": float(variance),
    }
