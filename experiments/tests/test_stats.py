"""The statistics against closed forms, scipy and simulated properties (never gbstats: the
benchmark compares with it in its own virtualenv)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from experiments import simulation, stats


def _units(rng, n, ctr=0.1, lift=0.0):
    return simulation.Population(ctr=ctr).draw(rng, (n,), lift=lift)


def test_ratio_variance_is_the_linearised_residual_variance():
    rng = np.random.default_rng(1)
    clicks, imps = _units(rng, 5000)
    r = stats.RatioStats.from_units(clicks, imps)
    ratio = clicks.sum() / imps.sum()
    residual = (clicks - ratio * imps) / imps.mean()
    assert r.mean == pytest.approx(ratio)
    assert r.variance == pytest.approx(residual.var(ddof=1), rel=1e-9)


def test_absolute_mean_difference_equals_scipy_welch():
    rng = np.random.default_rng(2)
    a = rng.normal(1.0, 2.0, 300)
    b = rng.normal(1.3, 3.0, 500)
    eff = stats.compare(
        stats.MeanStats.from_values(a), stats.MeanStats.from_values(b), relative=False
    )
    ref = sps.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert eff.estimate == pytest.approx(b.mean() - a.mean(), rel=1e-12)
    assert eff.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert (eff.ci_low, eff.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-9)


def test_relative_variance_is_the_delta_method_of_the_ratio_of_means():
    a = stats.MeanStats(n=1000, sum=2000.0, sum_squares=2000.0 * 2 + 999 * 4)
    b = stats.MeanStats(n=1200, sum=2520.0, sum_squares=2520.0 * 2.1 + 1199 * 9)
    eff = stats.compare(a, b, relative=True)
    # gradient of mb/ma - 1 at (ma, mb) is (-mb/ma^2, 1/ma)
    ma, mb = a.mean, b.mean
    var = (mb / ma**2) ** 2 * a.variance / a.n + (1 / ma) ** 2 * b.variance / b.n
    assert eff.estimate == pytest.approx(mb / ma - 1)
    assert eff.se == pytest.approx(math.sqrt(var), rel=1e-12)


def test_relative_ratio_intervals_cover_the_true_lift():
    rng = np.random.default_rng(3)
    pop = simulation.Population(ctr=0.2, mean_impressions=10)
    a, b = simulation.simulate_arms(rng, pop, sims=1000, units_per_arm=1500, lift=0.05)
    res = stats.relative_tests_arrays(a, b)
    covered = (res["ci_low"][:, -1] <= 0.05) & (res["ci_high"][:, -1] >= 0.05)
    assert 0.935 <= covered.mean() <= 0.965


def test_scalar_and_vector_paths_agree():
    rng = np.random.default_rng(4)
    ca, ia = _units(rng, 800)
    cb, ib = _units(rng, 900, lift=0.1)
    ra, rb = stats.RatioStats.from_units(ca, ia), stats.RatioStats.from_units(cb, ib)
    as_arrays = lambda r: {  # noqa: E731
        "n": np.array([r.n]),
        "sum_m": np.array([r.sum_m]),
        "sum_m2": np.array([r.sum_m2]),
        "sum_d": np.array([r.sum_d]),
        "sum_d2": np.array([r.sum_d2]),
        "sum_md": np.array([r.sum_md]),
    }
    for sequential in (False, True):
        eff = stats.compare(ra, rb, sequential=sequential, tuning=3000)
        vec = stats.relative_tests_arrays(
            as_arrays(ra), as_arrays(rb), sequential=sequential, tuning=3000
        )
        assert vec["estimate"][0] == pytest.approx(eff.estimate, rel=1e-12)
        assert vec["ci_low"][0] == pytest.approx(eff.ci_low, rel=1e-9)
        assert vec["p_value"][0] == pytest.approx(eff.p_value, rel=1e-9)


def test_sequential_interval_is_wider_and_agrees_with_its_p_value():
    rng = np.random.default_rng(5)
    pop = simulation.Population()
    a, b = simulation.simulate_arms(rng, pop, sims=400, units_per_arm=2000, lift=0.04, days=10)
    fixed = stats.relative_tests_arrays(a, b)
    seq = stats.relative_tests_arrays(a, b, sequential=True, tuning=4000)
    assert np.all(seq["ci_high"] - seq["ci_low"] > fixed["ci_high"] - fixed["ci_low"])
    excludes_zero = (seq["ci_low"] > 0) | (seq["ci_high"] < 0)
    assert np.array_equal(excludes_zero, seq["p_value"] < 0.05)


def test_srm_check_is_scipys_chi_square_and_flags_a_mismatch():
    res = stats.srm_check([5100, 4900], [1, 1])
    ref = sps.chisquare([5100, 4900])
    assert res.p_value == pytest.approx(ref.pvalue)
    assert not res.mismatch
    assert stats.srm_check([50_600, 49_400], [1, 1]).mismatch
    assert not stats.srm_check([30_000, 10_000], [3, 1]).mismatch


def test_cuped_reduces_variance_without_bias():
    rng = np.random.default_rng(6)
    estimates, raw = [], []
    for _ in range(200):
        pre = rng.gamma(2.0, 2.0, size=(2, 1000))
        post = 0.8 * pre + rng.normal(0, 1.0, size=(2, 1000))
        post[1] += 0.1
        a = stats.CupedStats.from_values(post[0], pre[0])
        b = stats.CupedStats.from_values(post[1], pre[1])
        eff = stats.compare(a, b, relative=False)
        plain = stats.compare(a.post, b.post, relative=False)
        assert eff.se < 0.5 * plain.se
        estimates.append(eff.estimate)
        raw.append(plain.estimate)
    assert np.mean(estimates) == pytest.approx(0.1, abs=0.01)
    assert np.std(estimates) < 0.5 * np.std(raw)


def test_degenerate_inputs_give_an_uninformative_result():
    zero = stats.RatioStats(n=10, sum_m=0, sum_m2=0, sum_d=10, sum_d2=10, sum_md=0)
    some = stats.RatioStats.from_units([1, 0, 2], [3, 3, 3])
    assert stats.compare(zero, some).error
    assert stats.compare(stats.MeanStats(1, 1, 1), stats.MeanStats(1, 1, 1)).p_value == 1.0


def test_aa_false_positive_rate_with_and_without_peeking():
    rates = simulation.aa_false_positive_rates(sims=1000, units_per_arm=1400, days=14)
    assert 0.035 <= rates["fixed_final"] <= 0.065
    # peeking at a fixed-horizon test inflates false positives; the sequential ones do not:
    # alpha spending over the 14 daily looks keeps it at alpha, the always-valid interval
    # (built for any number of looks) stays below it
    assert rates["fixed_peeking"] > 0.12
    assert 0.035 <= rates["group_sequential_peeking"] <= 0.065
    assert 0.035 <= rates["group_sequential_peeking_pocock"] <= 0.065
    assert rates["sequential_peeking"] <= 0.065


def test_power_matches_the_sample_size_promise():
    pop = simulation.Population(ctr=0.3, mean_impressions=20, concentration=30)
    out = simulation.power_check(relative_lift=0.03, sims=1000, population=pop)
    assert out["power_promised"] == pytest.approx(0.8, abs=0.005)
    assert abs(out["power_observed"] - out["power_promised"]) <= 0.05


def test_the_read_out_has_each_arms_interval_and_srm():
    rng = np.random.default_rng(12)
    arms = {}
    for name, n in (("control", 900), ("treatment", 950)):
        clicks, imps = _units(rng, n)
        arms[name] = stats.ArmData(imps, clicks, (clicks > 2).astype(float), clicks * 0.3)
    out = stats.analyze(arms, control="control", planned_weights={"control": 1, "treatment": 1})
    ctr = out["arms"]["control"]
    r = stats.RatioStats.from_units(arms["control"].clicks, arms["control"].impressions)
    half = sps.norm.ppf(0.975) * math.sqrt(r.variance / r.n)
    assert ctr["ctr_ci"] == pytest.approx([r.mean - half, r.mean + half])
    assert out["srm"]["p_value"] == pytest.approx(sps.chisquare([900, 950]).pvalue)
    assert set(out["effects"]["treatment"]) == {"ctr", "cvr", "rpm"}


# --- group-sequential boundaries ----------------------------------------------------------------


def test_one_look_is_the_fixed_horizon_test():
    for spending in stats.SPENDING_FUNCTIONS:
        (bound,) = stats.group_sequential_bounds([1.0], spending=spending)
        assert bound == pytest.approx(sps.norm.isf(0.025), abs=1e-6)  # 1.95996
    (bound,) = stats.group_sequential_bounds([1.0], alpha=0.1)
    assert bound == pytest.approx(1.644854, abs=1e-6)


def test_bounds_match_published_designs():
    looks = np.arange(1, 6) / 5
    # Lan-DeMets O'Brien-Fleming-type spending, K = 5, two-sided 0.05 (gsDesign sfLDOF,
    # ldbounds; DeMets & Lan 1994)
    obf = stats.group_sequential_bounds(looks, spending="obrien_fleming")
    assert obf == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=2e-3)
    # Lan-DeMets Pocock-type spending (Jennison & Turnbull 2000, ch. 7)
    poc = stats.group_sequential_bounds(looks, spending="pocock")
    assert poc == pytest.approx([2.438, 2.427, 2.410, 2.397, 2.386], abs=2e-3)
    # Pocock's (1977) constant boundary: 2.413 for K = 5, 2.178 for K = 2
    assert stats.pocock_constant(5) == pytest.approx(2.413, abs=1e-3)
    assert stats.pocock_constant(2) == pytest.approx(2.178, abs=1e-3)


def test_bounds_spend_exactly_alpha_over_any_looks():
    # unequal looks, and spending on calendar time with correlation from the units seen
    fractions = [0.1, 0.3, 0.35, 0.8, 1.0]
    for spending in stats.SPENDING_FUNCTIONS:
        bounds = stats.group_sequential_bounds(fractions, spending=spending)
        assert stats.crossing_probability(fractions, bounds) == pytest.approx(0.05, abs=1e-6)
        partial = stats.crossing_probability(fractions[:3], bounds[:3])
        assert partial == pytest.approx(stats.alpha_spent(0.35, spending=spending), abs=1e-7)
    units = [1000, 4000, 4500, 12000, 15000]
    bounds = stats.group_sequential_bounds(fractions, information=units)
    by_units = [u / units[-1] for u in units]
    assert stats.crossing_probability(by_units, bounds) == pytest.approx(0.05, abs=1e-6)
    with pytest.raises(ValueError, match="increasing"):
        stats.group_sequential_bounds([0.5, 0.4])


def test_group_sequential_type_one_error_by_direct_simulation_of_z():
    # independent of the data model: z statistics of a Brownian motion at 14 daily looks
    rng = np.random.default_rng(5)
    steps = rng.standard_normal((200_000, 14)).cumsum(axis=1)
    z = np.abs(steps) / np.sqrt(np.arange(1, 15))
    for spending in stats.SPENDING_FUNCTIONS:
        bounds = stats.group_sequential_bounds(np.arange(1, 15) / 14, spending=spending)
        assert (z >= bounds).any(axis=1).mean() == pytest.approx(0.05, abs=0.0025)


def test_the_read_out_at_a_look_judges_against_its_boundary():
    rng = np.random.default_rng(13)
    arms = {}
    for name, n, lift in (("control", 4000, 0.0), ("treatment", 4000, 0.15)):
        clicks, imps = _units(rng, n, lift=lift)
        arms[name] = stats.ArmData(imps, clicks, (clicks > 2).astype(float), clicks * 0.3)
    out = stats.analyze(
        arms,
        control="control",
        planned_weights={"control": 1, "treatment": 1},
        looks=stats.LookPlan(fractions=(0.25, 0.5)),
    )
    assert out["sequential_method"] == "group_sequential"
    bound = stats.group_sequential_bounds([0.25, 0.5])[-1]
    assert out["group_sequential"]["bounds"][-1] == pytest.approx(bound)
    gs, fixed = (out["effects"]["treatment"]["ctr"][k] for k in ("group_sequential", "relative"))
    assert gs["estimate"] == fixed["estimate"] and gs["bound"] == pytest.approx(bound)
    assert gs["ci_high"] - gs["ci_low"] == pytest.approx(2 * bound * fixed["se"])
    assert gs["significant"] == (abs(fixed["estimate"]) / fixed["se"] >= bound)
    plain = stats.analyze(arms, control="control", planned_weights={"control": 1, "treatment": 1})
    assert plain["sequential_method"] == "always_valid"
    assert "group_sequential" not in plain["effects"]["treatment"]["ctr"]


@pytest.mark.django_db
def test_a_running_experiment_reads_out_at_its_daily_looks(workspace, members):
    from datetime import timedelta

    from experiments import services
    from experiments.tests.factories import make_deployment
    from experiments.tests.test_flow import _create, _traffic
    from workspaces.models import Role

    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment], ramp_plan=[10, 20])
    )
    rng = np.random.default_rng(3)
    ctr = {"control": 0.1, "treatment": 0.1}
    _traffic(workspace, dep, exp, units=[f"a{i}" for i in range(800)], ctr=ctr, rng=rng)
    day1 = exp.started_at + timedelta(days=1)
    services.snapshot_take(experiment=exp, now=day1 - timedelta(minutes=1))
    first = services.experiment_analyze(exp, now=day1 - timedelta(minutes=1))
    assert first["group_sequential"]["fractions"] == [pytest.approx(0.5, abs=1e-3)]
    _traffic(workspace, dep, exp, units=[f"b{i}" for i in range(800)], ctr=ctr, rng=rng)
    # two planned days (one per ramp step): the second read is the final look, correlated with
    # the first through the units seen then
    out = services.experiment_analyze(exp, now=exp.started_at + timedelta(days=2, hours=1))
    plan = out["group_sequential"]
    seen = sum(a["units"] for a in first["arms"].values())
    now = sum(a["units"] for a in out["arms"].values())
    assert plan["fractions"] == [0.5, 1.0] and plan["information"] == [seen, now]
    expected = stats.group_sequential_bounds([0.5, 1.0], information=[seen, now])
    assert plan["bounds"] == pytest.approx(list(expected))
    assert out["effects"]["treatment"]["ctr"]["group_sequential"]["bound"] == pytest.approx(
        expected[-1]
    )


@pytest.mark.django_db
def test_the_experiments_sequential_method_and_spending_are_its_own(workspace, members):
    from datetime import timedelta

    from django.core.exceptions import ValidationError

    from experiments import services
    from experiments.tests.factories import make_deployment
    from experiments.tests.test_flow import _create, _traffic
    from workspaces.models import Role

    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    with pytest.raises(ValidationError, match="sequential_method"):
        _create(workspace, dev, dep, [treatment], key="bad", sequential_method="peek-freely")
    always = _create(workspace, dev, dep, [treatment], key="av", sequential_method="always_valid")
    pocock = _create(workspace, dev, dep, [treatment], key="pk", spending="pocock")
    rng = np.random.default_rng(5)
    ctr = {"control": 0.1, "treatment": 0.1}
    for exp in (services.experiment_submit(actor=dev, experiment=e) for e in (always, pocock)):
        _traffic(workspace, dep, exp, units=[f"{exp.key}{i}" for i in range(300)], ctr=ctr, rng=rng)
        out = services.experiment_analyze(exp, now=exp.started_at + timedelta(hours=12))
        if exp.key == "av":
            assert out["sequential_method"] == "always_valid"
            assert "group_sequential" not in out["effects"]["treatment"]["ctr"]
        else:
            assert out["group_sequential"]["spending"] == "pocock"
            fractions = out["group_sequential"]["fractions"]
            expected = stats.group_sequential_bounds(fractions, spending="pocock")
            assert out["group_sequential"]["bounds"] == pytest.approx(list(expected))
