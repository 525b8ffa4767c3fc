"""The pure decisions of shard ownership: fair share, the balanced rendezvous split, what to claim."""

import pytest

from shared.shards import assign, fair_share, plan_membership


@pytest.mark.parametrize(
    ("shards", "members", "share"), [(16, 1, 16), (16, 2, 8), (16, 3, 6), (16, 5, 4), (3, 5, 1), (16, 0, 16)]
)
def test_fair_share_is_the_ceiling(shards: int, members: int, share: int) -> None:
    assert fair_share(shards, members) == share


# --- membership (README "Shard ownership leases") --------------------------------------------


def test_assign_is_balanced_deterministic_and_moves_little() -> None:
    members = ["m-a", "m-b", "m-c"]
    split = assign(16, members)
    assert split == assign(16, list(reversed(members)))  # every replica computes the same split
    assert sorted(split) == list(range(16))
    loads = sorted(list(split.values()).count(m) for m in members)
    assert max(loads) <= 6 and sum(loads) == 16
    # A member joins: only shards that go to the newcomer move.
    bigger = assign(16, [*members, "m-d"])
    moved = {s for s in range(16) if bigger[s] != split[s]}
    assert len(moved) <= 6, moved  # the 4 the newcomer takes, and at most one chain of refills
    assert list(bigger.values()).count("m-d") == 4
    assert assign(4, []) == {}


def test_plan_claims_only_uncontested_shards_of_ours() -> None:
    live = ["m-a", "m-b"]
    mine = {s for s, m in assign(16, live).items() if m == "m-a"}
    theirs = set(range(16)) - mine
    # Nothing claimed by anyone: claim exactly our split.
    assert plan_membership("m-a", 16, live, frozenset(), frozenset(), {}) == mine
    # m-b still claims all 16 (it was alone): wait for it to drop ours.
    others = {s: {"m-b"} for s in range(16)}
    assert plan_membership("m-a", 16, live, frozenset(), frozenset(), others) == frozenset()
    # What we act on we keep; what is no longer ours we drop.
    acting = frozenset(set(theirs) | {min(mine)})
    kept = plan_membership("m-a", 16, live, acting, acting, others)
    assert kept == {min(mine)}
    # Views differ (each still sees only itself live) and both claimed a shard, neither acting on
    # it: exactly one keeps its claim (the tie-break), so one of them can confirm it.
    for s in range(16):
        a_keeps = plan_membership("m-a", 16, ["m-a"], frozenset({s}), frozenset(), {s: {"m-b"}})
        b_keeps = plan_membership("m-b", 16, ["m-b"], frozenset({s}), frozenset(), {s: {"m-a"}})
        assert (s in a_keeps) != (s in b_keeps)
