"""The burst benchmark's pure computations (tests/bench/burst_figures.py): the growth ratio on wall
time and on CPU, CPU per runner, the burst's shape and the quiet-stack check."""

from __future__ import annotations

import pytest

from tests.bench import burst_figures as fig


def test_linear_growth_is_one_and_superlinear_above() -> None:
    ratio = fig.growth({300: 3.0, 1000: 10.0, 3000: 45.0})
    assert ratio == pytest.approx({300: 1.0, 1000: 1.0, 3000: 1.5})


def test_a_fixed_latency_makes_growth_look_sublinear() -> None:
    # 1 s before the first pod, then 100 pods/s: t(300) = 4 s, t(3,000) = 31 s -> 0.78, not 1.0.
    ratio = fig.growth({300: 1.0 + 300 / 100, 3000: 1.0 + 3000 / 100})
    assert ratio[3000] == pytest.approx((31 / 3000) / (4 / 300))
    assert ratio[3000] < 1.0


def test_growth_without_the_base_size_is_empty() -> None:
    assert fig.growth({1000: 10.0, 3000: 30.0}) == {}
    assert fig.growth({300: 0.0, 3000: 30.0}) == {}
    assert fig.growth({100: 1.0, 300: 3.0}, base=100) == pytest.approx({100: 1.0, 300: 1.0})


def test_cpu_per_runner_sums_the_components() -> None:
    assert fig.cpu_ms_per_runner({"apiserver": 1.5, "runner": 3.0, "node-sim": 1.5}, 300) == pytest.approx(20.0)


def test_cores_used_is_cpu_over_wall() -> None:
    assert fig.cores_used({"apiserver": 30.0, "runner": 30.0}, 40.0) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        fig.cores_used({"apiserver": 1.0}, 0.0)


def test_shape_of_a_burst() -> None:
    # 100 pods: the first at 0.5 s, then one every 0.1 s.
    times = [0.5 + 0.1 * i for i in range(100)]
    times.reverse()  # the order seen does not matter
    sh = fig.shape(times)
    assert sh.first == pytest.approx(0.5)
    assert sh.p10 == pytest.approx(0.5 + 0.1 * 9)
    assert sh.p50 == pytest.approx(0.5 + 0.1 * 49)
    assert sh.p90 == pytest.approx(0.5 + 0.1 * 89)
    assert sh.last == pytest.approx(0.5 + 0.1 * 99)
    assert sh.steady_rate(100) == pytest.approx(80 / 8.0)  # 10 pods/s, the fixed 0.5 s left out


def test_shape_of_one_pod_and_of_none() -> None:
    sh = fig.shape([2.0])
    assert (sh.first, sh.p10, sh.p50, sh.p90, sh.last) == (2.0, 2.0, 2.0, 2.0, 2.0)
    assert sh.steady_rate(1) == 0.0
    with pytest.raises(ValueError):
        fig.shape([])


def test_quiet_stack() -> None:
    before = {"apiserver": 10.0, "runner": 5.0}
    assert fig.is_quiet(before, {"apiserver": 10.05, "runner": 5.1}, 1.0, 0.2)
    assert not fig.is_quiet(before, {"apiserver": 10.2, "runner": 5.1}, 1.0, 0.2)
    # a process that appeared between the samples counts all its CPU
    assert not fig.is_quiet(before, {"apiserver": 10.0, "runner": 5.0, "node-sim": 0.5}, 1.0, 0.2)
    assert fig.is_quiet(before, {"apiserver": 10.2, "runner": 5.1}, 2.0, 0.2)
    with pytest.raises(ValueError):
        fig.is_quiet(before, before, 0.0, 0.2)


def test_marginal_cost_is_flat_for_an_affine_burst_that_the_ratio_calls_superlinear() -> None:
    # A client-side limiter: 400 requests at once, then 200/s, 2.5 requests per runner:
    # t(N) = (2.5 N - 400) / 200. Linear in N, but a 300 burst mostly fits in the allowance.
    times = {n: (2.5 * n - 400) / 200 for n in (300, 1000, 3000)}
    assert fig.growth(times)[3000] > 2.0
    assert fig.marginal_ms(times) == pytest.approx({1000: 12.5, 3000: 12.5})
    assert fig.marginal_growth(times) == pytest.approx(1.0)


def test_marginal_cost_rises_for_the_quadratic_burst_issue_10_measured() -> None:
    times = {n: 0.065 * n + 4.5e-5 * n * n for n in (100, 300, 1000, 3000)}
    m = fig.marginal_ms(times)
    assert list(m) == [300, 1000, 3000]
    assert m[300] < m[1000] < m[3000]
    # From 300 up only: (0.065 + 4.5e-5 * 4000) / (0.065 + 4.5e-5 * 1300).
    assert fig.marginal_growth(times) == pytest.approx(0.245 / 0.1235)


def test_marginal_growth_needs_two_intervals_from_the_base() -> None:
    assert fig.marginal_growth({100: 1.0, 300: 2.0, 1000: 9.0}) is None
    assert fig.marginal_growth({300: 2.0, 1000: 2.0, 3000: 30.0}) is None
    assert fig.marginal_ms({300: 2.0}) == {}
