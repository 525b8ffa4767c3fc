"""Failed-runner TTL and failure budget of the runner-set worker (services/runner_set/failures.py,
and how plan() uses them): pure, with the clock passed in."""

from __future__ import annotations

import argparse
import datetime as dt
import itertools

import pytest

from services.runner_set import decide, failures
from services.runner_set.failures import (
    ANNOTATION_FAILURE_BUDGET,
    ANNOTATION_REPLACES,
    FailurePolicy,
)
from services.runner_set.worker import WORKER
from shared import settings as loader
from shared.api import EphemeralRunner, EphemeralRunnerSet, decode
from shared.api.constants import ANNOTATION_ACTIONABLE_REVISION, ANNOTATION_FAILED_AT, ANNOTATION_PATCH_ID
from shared.worker import SettingsError

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
POLICY = FailurePolicy(failed_runner_ttl=300, budget_failures=3, budget_window=600, backoff_base=30, backoff_max=120)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def ers(*, replicas: int = 3, patch_id: int = 0, revision: int = 1, budget: str | None = None) -> EphemeralRunnerSet:
    ann = {ANNOTATION_FAILURE_BUDGET: budget} if budget is not None else {}
    return decode(
        EphemeralRunnerSet,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunnerSet",
            "metadata": {
                "name": "set",
                "namespace": "ns",
                "uid": "ers-uid",
                "resourceVersion": "7",
                "annotations": ann,
            },
            "spec": {
                "replicas": replicas,
                "patchID": patch_id,
                "actionableRevision": revision,
                "ephemeralRunnerSpec": {
                    "githubConfigUrl": "https://github.com/org",
                    "githubConfigSecret": "s",
                    "runnerScaleSetId": 1,
                },
            },
            "status": {"appliedActionableRevision": revision, "phase": "Running"},
        },
    )


_names = itertools.count(1)  # unique names and uids across a module's runners


def er(
    phase: str = "",
    *,
    failed: float | None = None,
    created: float = 0.0,
    revision: int = 1,
    job: str = "",
    runner_id: int = 7,
    patch: int = 0,
    replaces: str = "",
    deleting: bool = False,
    reason: str = "InvalidPod",
) -> EphemeralRunner:
    n = next(_names)
    ann = {ANNOTATION_ACTIONABLE_REVISION: str(revision), ANNOTATION_PATCH_ID: str(patch)}
    if failed is not None:
        ann[ANNOTATION_FAILED_AT] = at(failed).isoformat()
    if replaces:
        ann[ANNOTATION_REPLACES] = replaces
    meta = {
        "name": f"set-runner-{n}",
        "namespace": "ns",
        "uid": f"u{n}",
        "annotations": ann,
        "creationTimestamp": at(created).isoformat().replace("+00:00", "Z"),
        "ownerReferences": [
            {
                "apiVersion": "actions.github.com/v1alpha1",
                "kind": "EphemeralRunnerSet",
                "name": "set",
                "uid": "ers-uid",
                "controller": True,
            }
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = at(created).isoformat().replace("+00:00", "Z")
    return decode(
        EphemeralRunner,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": meta,
            "spec": {"githubConfigUrl": "https://github.com/org", "githubConfigSecret": "s", "runnerScaleSetId": 1},
            "status": {
                "phase": phase,
                "runnerId": runner_id,
                "jobId": job,
                **({"reason": reason} if phase == "Failed" else {}),
            },
        },
    )


def plan(
    s: EphemeralRunnerSet, runners: list[EphemeralRunner], now: dt.datetime, policy: FailurePolicy = POLICY
) -> decide.Plan:
    return decide.plan(s, decide.bucket_runners(runners), now, policy)


def record_of(p: decide.Plan) -> failures.BudgetRecord:
    assert p.budget is not None and p.budget.record is not None
    rec = failures.parse_record({ANNOTATION_FAILURE_BUDGET: p.budget.record})
    assert rec is not None
    return rec


# --- failed_at ---------------------------------------------------------------------------------------


def test_failed_at_prefers_the_runner_workers_stamp_then_falls_back_to_a_lower_bound() -> None:
    assert failures.failed_at(er("Failed", failed=42, created=1)) == at(42)
    # no stamp (ARC, older versions): the latest of creation and last pod failure
    legacy = er("Failed", created=5)
    assert failures.failed_at(legacy) == at(5)
    garbled = er("Failed", created=9)
    garbled.metadata.annotations[ANNOTATION_FAILED_AT] = "yesterday"
    assert failures.failed_at(garbled) == at(9)


# --- TTL ------------------------------------------------------------------------------------------------


def test_failed_runner_is_kept_before_the_ttl_and_swapped_after_it() -> None:
    f = er("Failed", failed=10)
    running = [er("Running"), er("Running")]
    before = plan(ers(replicas=3, patch_id=4), [f, *running], at(10 + 299))
    assert before.reap == [] and before.create == 0
    assert before.requeue_after == pytest.approx(1.0)  # wakes itself up when the TTL ends
    after = plan(ers(replicas=3, patch_id=4), [f, *running], at(10 + 300))
    assert after.reason == "failed-ttl"
    assert after.reap == [f] and after.replace == [f.metadata.uid]


def test_swap_ignores_the_patch_id_protocol() -> None:
    # patch 4 already applied (ARC: status only), yet the failed runner is replaced: lost capacity
    f = er("Failed", failed=0, patch=4)
    p = plan(ers(replicas=2, patch_id=4), [f, er("Running", patch=4)], at(1000))
    assert p.reap == [f] and p.replace == [f.metadata.uid]


def test_no_replacement_when_replicas_no_longer_want_it() -> None:
    f = er("Failed", failed=0)
    p = plan(ers(replicas=2), [f, er("Running"), er("Running")], at(1000))
    assert p.reap == [f] and p.replace == []


def test_replacement_is_not_created_twice_after_a_crash_before_the_delete() -> None:
    f = er("Failed", failed=0)
    repl = er("", replaces=f.metadata.uid)
    p = plan(ers(replicas=2), [f, repl, er("Running")], at(1000))
    assert p.reap == [f] and p.replace == []


def test_ttl_zero_keeps_failed_runners_forever_as_arc() -> None:
    f = er("Failed", failed=0)
    p = plan(ers(replicas=1), [f], at(10**6), FailurePolicy(failed_runner_ttl=0))
    assert p.reap == [] and p.create == 0


def test_without_a_policy_plan_keeps_arcs_rules() -> None:
    f = er("Failed", failed=0)
    p = decide.plan(ers(replicas=1), decide.bucket_runners([f]))
    assert p.reap == [] and p.budget is None and p.create == 0


def test_runner_with_unknown_failure_time_never_expires() -> None:
    f = er("Failed")
    f.metadata.creation_timestamp = None
    assert plan(ers(replicas=1), [f], at(10**6)).reap == []


# --- budget ---------------------------------------------------------------------------------------------


def test_budget_not_exceeded_allows_creation() -> None:
    fs = [er("Failed", failed=i) for i in range(3)]  # 3 failures, budget 3: not more than it
    p = plan(ers(replicas=5), fs, at(10))
    assert p.budget is not None
    assert p.budget.blocked_until is None and p.create == 2 and p.budget.failures == 3


def test_more_than_budget_in_window_backs_creation_off_with_an_event_record() -> None:
    fs = [er("Failed", failed=i) for i in range(4)]
    p = plan(ers(replicas=6), fs, at(10))
    assert p.reason == "failure-backoff" and p.create == 0
    assert p.budget is not None
    assert p.budget.escalated and p.budget.level == 1 and p.budget.blocked_until == at(40)
    assert "4 runners failed" in p.budget.message
    assert p.requeue_after == pytest.approx(30.0)
    rec = record_of(p)
    assert (
        rec.level == 1
        and rec.until == at(40)
        and rec.revision == 1
        and set(rec.failures) == {f.metadata.uid for f in fs}
    )


def test_failures_outside_the_window_do_not_count() -> None:
    old = [er("Failed", failed=i) for i in range(4)]
    p = plan(
        ers(replicas=6), old, at(3 + 600 + 1), FailurePolicy(failed_runner_ttl=0, budget_failures=3, budget_window=600)
    )
    assert p.budget is not None
    assert p.budget.failures == 0 and p.budget.blocked_until is None


def test_backoff_is_resumed_from_the_record_by_any_replica_and_not_escalated_while_blocked() -> None:
    fs = [er("Failed", failed=i) for i in range(4)]
    rec = record_of(plan(ers(replicas=6), fs, at(10)))
    s = ers(replicas=6, budget=failures.encode_record(rec))
    more = [*fs, er("Failed", failed=20)]  # a runner created before the backoff fails meanwhile
    p = plan(s, more, at(25))
    assert p.budget is not None
    assert p.create == 0 and not p.budget.escalated and p.budget.level == 1 and p.budget.record is None
    assert p.requeue_after == pytest.approx(15.0)


def test_expiry_without_new_failures_resumes_creation_then_a_new_failure_doubles_the_backoff() -> None:
    fs = [er("Failed", failed=i) for i in range(4)]
    s = ers(replicas=6, budget=failures.encode_record(record_of(plan(ers(replicas=6), fs, at(10)))))
    resumed = plan(s, fs, at(41))
    assert resumed.budget is not None
    assert resumed.budget.blocked_until is None and resumed.create == 2 and not resumed.budget.escalated
    again = plan(s, [*fs, er("Failed", failed=45)], at(46))
    assert again.budget is not None
    assert again.budget.escalated and again.budget.level == 2 and again.budget.blocked_until == at(46 + 60)
    assert again.create == 0


def test_backoff_is_capped() -> None:
    p = FailurePolicy(backoff_base=30, backoff_max=120)
    assert [p.backoff(n) for n in range(1, 7)] == [30, 60, 120, 120, 120, 120]
    assert p.backoff(10_000) == 120


def test_reaped_failures_are_recorded_before_the_reap_and_still_count() -> None:
    fs = [er("Failed", failed=i) for i in range(3)]
    p = plan(
        ers(replicas=3), fs, at(300 + 3), FailurePolicy(failed_runner_ttl=300, budget_failures=3, budget_window=600)
    )
    assert p.reason == "failed-ttl" and len(p.reap) == 3
    rec = record_of(p)  # written first by the controller (locked), then the runners are deleted
    assert set(rec.failures) == {f.metadata.uid for f in fs}
    # after the reap: the failed runners are gone, the record still counts them; one more failure
    s = ers(replicas=3, budget=failures.encode_record(rec))
    q = plan(
        s,
        [er("Failed", failed=310), er(""), er("")],
        at(311),
        FailurePolicy(failed_runner_ttl=300, budget_failures=3, budget_window=600),
    )
    assert q.budget is not None
    assert q.budget.escalated and q.budget.failures == 4


def test_a_success_after_the_first_failure_resets_the_budget() -> None:
    fs = [er("Failed", failed=i, created=i) for i in range(4)]
    s = ers(replicas=6, budget=failures.encode_record(record_of(plan(ers(replicas=6), fs, at(10)))))
    busy = er("Running", created=2, job="job-1")  # created during the failure episode, got a job
    p = plan(s, [*fs, busy], at(20))
    assert p.budget is not None
    assert p.budget.reset == "RunnerSucceeded" and p.budget.level == 0 and p.budget.blocked_until is None
    assert p.create == 1
    rec = record_of(p)
    assert rec.level == 0 and rec.failures == {} and rec.reset_at == at(20)
    # the failed runners still present are forgiven; the reset is not repeated
    q = plan(ers(replicas=6, budget=failures.encode_record(rec)), [*fs, busy], at(21))
    assert q.budget is not None
    assert q.budget.failures == 0 and q.budget.reset == "" and q.budget.record is None


def test_a_busy_runner_from_before_the_failures_does_not_reset() -> None:
    fs = [er("Failed", failed=10 + i, created=10 + i) for i in range(4)]
    old_busy = er("Running", created=0, job="job-1")
    p = plan(ers(replicas=6), [*fs, old_busy], at(20))
    assert p.budget is not None
    assert p.budget.escalated and p.budget.reset == ""


def test_a_revision_bump_resets_the_budget() -> None:
    fs = [er("Failed", failed=i, revision=1) for i in range(4)]
    rec = record_of(plan(ers(replicas=6, revision=1), fs, at(10)))
    # the spec was fixed: revision 2 (the revision cleanup has deleted the old failed runners)
    p = plan(ers(replicas=6, revision=2, budget=failures.encode_record(rec)), [], at(12))
    assert p.budget is not None
    assert p.budget.blocked_until is None and p.create == 6
    assert p.budget.reset == "RevisionChanged" and record_of(p).revision == 2 and record_of(p).level == 0
    # failed runners of an older revision never count against the new one
    q = plan(ers(replicas=6, revision=2), [er("Failed", failed=11, revision=1) for _ in range(5)], at(12))
    assert q.budget is not None
    assert q.budget.failures == 0


def test_decay_after_a_quiet_window() -> None:
    fs = [er("Failed", failed=i) for i in range(4)]
    rec = record_of(plan(ers(replicas=6), fs, at(10)))
    p = plan(ers(replicas=6, budget=failures.encode_record(rec)), [], at(40 + 600))
    assert p.budget is not None
    assert p.budget.level == 0 and p.budget.failures == 0


def test_budget_zero_disables_backoff_but_keeps_the_ttl() -> None:
    fs = [er("Failed", failed=i) for i in range(20)]
    p = plan(ers(replicas=30), fs, at(30), FailurePolicy(budget_failures=0))
    assert p.budget is not None
    assert p.budget.blocked_until is None and p.create == 10


def test_garbled_record_is_a_fresh_budget() -> None:
    p = plan(ers(replicas=1, budget="{not json"), [], at(0))
    assert p.budget is not None
    assert p.budget.level == 0 and p.create == 1


def test_budget_record_is_not_copied_onto_runners_and_replacements_are_annotated() -> None:
    s = ers(budget='{"revision":1}')
    body = decide.new_runner(s, replaces="u-failed")
    assert ANNOTATION_FAILURE_BUDGET not in body["metadata"]["annotations"]
    assert body["metadata"]["annotations"][ANNOTATION_REPLACES] == "u-failed"
    assert ANNOTATION_REPLACES not in decide.new_runner(s)["metadata"]["annotations"]


# --- settings ---------------------------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    return WORKER.parser().parse_args(argv)


def load_failure_policy(args: argparse.Namespace, env: dict[str, str]) -> FailurePolicy:
    return loader.load(FailurePolicy, args, env)


def test_settings_defaults_env_and_flags() -> None:
    assert load_failure_policy(_parse([]), {}) == FailurePolicy()
    assert (
        FailurePolicy().failed_runner_ttl == 300
        and FailurePolicy().budget_failures == 5
        and FailurePolicy().budget_window == 600
    )
    env = {"RUNNERSCALE_FAILED_RUNNER_TTL": "60", "RUNNERSCALE_FAILURE_BUDGET": "2"}
    p = load_failure_policy(_parse(["--failed-runner-ttl", "5", "--failure-budget-window", "30"]), env)
    assert (p.failed_runner_ttl, p.budget_failures, p.budget_window) == (5.0, 2, 30.0)


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--failed-runner-ttl", "soon"], {}, "--failed-runner-ttl"),
        ([], {"RUNNERSCALE_FAILURE_BUDGET": "-1"}, "RUNNERSCALE_FAILURE_BUDGET"),
        (["--failure-budget-backoff", "100", "--failure-budget-backoff-max", "10"], {}, "--failure-budget-backoff-max"),
    ],
)
def test_bad_settings_name_the_setting(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_failure_policy(_parse(argv), env)
    assert names in str(info.value)
