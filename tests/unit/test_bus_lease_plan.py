"""The pure decisions of shard ownership: fair share, preference order, what to claim or release."""

import pytest

from shared.shards import fair_share, plan_claims, preference_order


@pytest.mark.parametrize(
    ("shards", "members", "share"), [(16, 1, 16), (16, 2, 8), (16, 3, 6), (16, 5, 4), (3, 5, 1), (16, 0, 16)]
)
def test_fair_share_is_the_ceiling(shards: int, members: int, share: int) -> None:
    assert fair_share(shards, members) == share


def test_preference_is_a_stable_permutation_that_differs_between_replicas() -> None:
    a, b = preference_order("pod-a", 16), preference_order("pod-b", 16)
    assert sorted(a) == list(range(16)) == sorted(b)
    assert a == preference_order("pod-a", 16)
    assert a != b


def test_over_share_releases_the_least_preferred() -> None:
    pref = preference_order("pod-a", 16)
    held = set(range(16))
    claim, release = plan_claims(held, 16, 3, pref)
    assert claim == []
    assert len(release) == 10
    assert set(release) == set(pref[6:])


def test_under_share_tries_unheld_shards_in_preference_order() -> None:
    pref = preference_order("pod-a", 16)
    claim, release = plan_claims({pref[0]}, 16, 2, pref)
    assert release == []
    assert claim == pref[1:]


def test_at_share_does_nothing() -> None:
    pref = preference_order("pod-a", 4)
    assert plan_claims(set(pref[:2]), 4, 2, pref) == ([], [])
