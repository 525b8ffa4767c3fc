"""Pure decisions of the runner-set worker: ARC's patch-ID protocol
and the typed state of the seeds (000-003)."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import msgspec
import pytest

from services.runner_set import decide
from shared.api import AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet, decode, to_dict
from shared.api import finished as finished_mod
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    ANNOTATION_FINISHED_AT,
    ANNOTATION_JOB_COMPLETED,
    ANNOTATION_PATCH_ID,
    FINALIZER_EPHEMERAL_RUNNER,
    FINALIZER_RUNNER_REGISTRATION,
)
from shared.bus import DesiredState, JobCompleted, ResourceRef

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def ers(
    *,
    replicas: int = 0,
    patch_id: int = 0,
    revision: int = 0,
    applied: int = 0,
    marker: int | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    phase: str = "Running",
) -> EphemeralRunnerSet:
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
                "annotations": annotations or {},
                "labels": labels or {},
            },
            "spec": {
                "replicas": replicas,
                "patchID": patch_id,
                "actionableRevision": revision,
                "ephemeralRunnerSpec": {
                    "githubConfigUrl": "https://github.com/org",
                    "githubConfigSecret": "s",
                    "runnerScaleSetId": 1,
                    "spec": {"containers": [{"name": "runner", "image": "r"}]},
                },
            },
            "status": {"appliedActionableRevision": applied, "finishedRunnerCleanupPatchID": marker, "phase": phase},
        },
    )


_names = itertools.count(1)  # unique names and uids across a module's runners


def er(
    phase: str = "",
    *,
    runner_id: int = 0,
    job: str = "",
    patch: int | None = None,
    revision: int | None = None,
    age: int = 0,
    deleting: bool = False,
) -> EphemeralRunner:
    n = next(_names)
    ann = {}
    if patch is not None:
        ann[ANNOTATION_PATCH_ID] = str(patch)
    if revision is not None:
        ann[ANNOTATION_ACTIONABLE_REVISION] = str(revision)
    meta = {
        "name": f"set-runner-{n}",
        "namespace": "ns",
        "uid": f"u{n}",
        "annotations": ann,
        "creationTimestamp": (T0 + dt.timedelta(seconds=age)).isoformat().replace("+00:00", "Z"),
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
        meta["deletionTimestamp"] = T0.isoformat().replace("+00:00", "Z")
    return decode(
        EphemeralRunner,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": meta,
            "spec": {"githubConfigUrl": "https://github.com/org", "githubConfigSecret": "s", "runnerScaleSetId": 1},
            "status": {"phase": phase, "runnerId": runner_id, "jobId": job},
        },
    )


def plan_for(s: EphemeralRunnerSet, runners: list[EphemeralRunner]) -> decide.Plan:
    return decide.plan(s, decide.bucket_runners(runners))


# --- buckets -------------------------------------------------------------------------------------


def test_buckets_and_totals() -> None:
    runners = [
        er(""),
        er("Pending"),
        er("Running"),
        er("Succeeded"),
        er("Failed"),
        er("Outdated"),
        er("Running", deleting=True, patch=9),
        er(patch=3),
    ]
    b = decide.bucket_runners(runners)
    assert (len(b.pending), len(b.running), len(b.finished), len(b.failed), len(b.outdated), len(b.deleting)) == (
        3,
        1,
        1,
        1,
        1,
        1,
    )
    assert b.scale_total == 5  # pending + running + failed; finished/outdated/deleting do not count
    assert b.scale_up_total == 7  # deleting and finished runners count toward scale-up (not double-replaced)
    assert b.latest_patch_id == 9  # deleting runners included


def test_unparsable_patch_id_is_ignored() -> None:
    r = er()
    r.metadata.annotations[ANNOTATION_PATCH_ID] = "x"
    assert decide.bucket_runners([r, er(patch=2)]).latest_patch_id == 2


# --- patch-ID protocol -----------------------------------------------------------------------------


def test_patch_zero_is_authoritative_up() -> None:
    p = plan_for(ers(replicas=5, patch_id=0), [])
    assert p.create == 5 and p.reason == "scale-up"


def test_patch_zero_is_authoritative_down_oldest_pending_first_never_busy_or_unregistered() -> None:
    runners = [
        er("Running", runner_id=1, age=0),
        er("Pending", runner_id=2, age=5),
        er("Pending", runner_id=0, age=1),  # not registered yet: never a candidate
        er("Running", runner_id=3, job="j", age=2),  # busy: never a candidate
        er("Pending", runner_id=4, age=3),
    ]
    p = plan_for(ers(replicas=1, patch_id=0), runners)
    assert p.remove_count == 4
    assert [decide.runner_id(r) for r in p.remove] == [4, 2, 1]  # pending oldest first, then running


def test_new_patch_scales_up_only() -> None:
    runners = [er("Running", runner_id=i, patch=1) for i in (1, 2, 3)]
    p = plan_for(ers(replicas=1, patch_id=2), runners)
    assert p.create == 0 and p.remove_count == 0
    p = plan_for(ers(replicas=5, patch_id=2), runners)
    assert p.create == 2


def test_same_patch_is_status_only() -> None:
    runners = [er("Running", runner_id=1, patch=4), er("Succeeded", patch=4)]
    p = plan_for(ers(replicas=3, patch_id=4), runners)
    assert p.reason == "patch-already-applied" and p.create == 0 and not p.delete
    # ARC "keep finished runners until patch id changes": the finished one stays.


def test_deleting_runners_count_toward_scale_up() -> None:
    runners = [er("Running", runner_id=1, deleting=True), er("Running", runner_id=2)]
    assert plan_for(ers(replicas=2, patch_id=0), runners).create == 0
    assert plan_for(ers(replicas=3, patch_id=0), runners).create == 1


def test_failed_runners_occupy_replicas() -> None:
    assert plan_for(ers(replicas=2, patch_id=0), [er("Failed"), er("Running", runner_id=1)]).create == 0


# --- finished-runner cleanup ----------------------------------------------------


def test_finished_runners_reaped_and_marker_recorded_then_no_replacement() -> None:
    s = ers(replicas=2, patch_id=2)
    done, busy = er("Succeeded", patch=1), er("Running", runner_id=1, job="j", patch=1)
    p = plan_for(s, [done, busy])
    assert p.reason == "finished-cleanup" and p.delete == [done]
    assert p.status is not None
    assert p.status["finishedRunnerCleanupPatchID"] == 2
    assert p.create == 0  # the decision is made on the next reconcile, on post-cleanup data
    # next reconcile: the finished runner is gone, the marker equals the patch → suppressed
    p = plan_for(ers(replicas=2, patch_id=2, marker=2), [busy])
    assert p.create == 0 and p.reason == "scale-up-suppressed"
    # the listener publishes a fresh patch that accounts for the completion → scale-up resumes
    assert plan_for(ers(replicas=2, patch_id=3, marker=2), [busy]).create == 1


def test_finished_cleanup_reaped_once_per_patch() -> None:
    # marker already recorded for this patch: no status change needed, only the delete
    p = plan_for(ers(replicas=2, patch_id=2, marker=2), [er("Succeeded", patch=1)])
    assert p.reason == "finished-cleanup"
    assert not p.status or "finishedRunnerCleanupPatchID" not in p.status


def test_marker_follows_patch_id_down() -> None:
    """Seed 003: patch IDs reset (listener restart) and wrap; a `>=` guard would be a bug."""
    assert decide.next_cleanup_marker(7, 3) == 3
    assert decide.next_cleanup_marker(None, 0) == 0
    assert decide.next_cleanup_marker(5, 5) is None
    p = plan_for(ers(replicas=2, patch_id=3, marker=7), [er("Succeeded", patch=8)])
    assert p.status is not None
    assert p.status["finishedRunnerCleanupPatchID"] == 3
    # and the suppression then fires at the lower patch ID
    assert decide.scale_up_suppressed(3, 3)
    assert plan_for(ers(replicas=2, patch_id=3, marker=3), [er("Running", runner_id=1, patch=8)]).create == 0


def test_patch_zero_never_suppressed() -> None:
    assert not decide.scale_up_suppressed(0, 0)
    assert plan_for(ers(replicas=2, patch_id=0, marker=0), []).create == 2


# --- revision rollout (seeds 001, 002) ------------------------------------------------------------


def test_rollout_removes_idle_and_pending_of_old_revision_keeps_busy() -> None:
    idle = er("Running", runner_id=1, revision=1)
    pending = er("Pending", runner_id=0, revision=1)
    busy = er("Running", runner_id=2, job="j", revision=1)
    old_failed = er("Failed", revision=1)
    new = er("Running", runner_id=3, revision=2)
    p = plan_for(ers(replicas=3, revision=2, applied=1), [idle, pending, busy, old_failed, new])
    assert p.reason == "revision-cleanup"
    assert set(r.metadata.name for r in p.remove) == {idle.metadata.name, pending.metadata.name}
    assert p.delete == [old_failed]
    assert p.status is None and p.publish_applied is None  # not advanced before the cleanup is done


def test_rollout_advances_only_when_old_idle_gone_clears_marker_and_publishes() -> None:
    busy = er("Running", runner_id=2, job="j", revision=1)
    gone = er("Running", runner_id=1, revision=1, deleting=True)
    p = plan_for(ers(replicas=3, revision=2, applied=1, marker=5), [busy, gone])
    assert p.reason == "revision-applied"
    assert p.status is not None
    assert p.status["appliedActionableRevision"] == 2
    assert p.status["finishedRunnerCleanupPatchID"] is None
    assert p.publish_applied == 2


def test_applied_revision_never_goes_backwards() -> None:
    p = plan_for(ers(replicas=0, revision=1, applied=3), [])
    assert p.status is None or "appliedActionableRevision" not in p.status


def test_legacy_runners_without_annotation_count_as_revision_zero() -> None:
    p = plan_for(ers(replicas=1, revision=1, applied=0), [er("Running", runner_id=1)])
    assert p.reason == "revision-cleanup"


def test_stale_outdated_deleted_current_outdated_holds_phase() -> None:
    stale = er("Outdated", revision=1)
    p = plan_for(ers(replicas=2, revision=2, applied=2), [stale, er("Running", runner_id=1, revision=2)])
    assert p.reason == "stale-outdated" and p.delete == [stale]
    current = er("Outdated", revision=2)
    p = plan_for(ers(replicas=2, revision=2, applied=2), [current])
    assert p.reason == "outdated-hold" and p.create == 0 and not p.delete
    assert p.status is not None
    assert p.status["phase"] == "Outdated"


def test_phase_recomputed_both_ways_when_revision_applied() -> None:
    # an Outdated runner of the old revision no longer holds the phase once revision 2 applies
    s = ers(replicas=0, revision=2, applied=1, phase="Outdated")
    p = plan_for(s, [er("Outdated", revision=1, deleting=True)])
    assert p.status is not None
    assert p.reason == "revision-applied" and p.status["phase"] == "Running"


# --- desired state ordering -------------------------------------------------------------------------


def ds(epoch: int, t: float, *, patch: int = 1, replicas: int = 2) -> DesiredState:
    return DesiredState(
        scale_set_id=1,
        ers=ResourceRef("ns", "set"),
        patch_id=patch,
        replicas=replicas,
        listener_epoch=epoch,
        time=T0 + dt.timedelta(seconds=t),
    )


def applied_ann(epoch: int, t: float, patch: int = 0, replicas: int = 0) -> dict[str, str]:
    rec = decide.AppliedDesired(epoch=epoch, time=T0 + dt.timedelta(seconds=t), patch_id=patch, replicas=replicas)
    return {decide.ANNOTATION_APPLIED_DESIRED_STATE: msgspec.json.encode(rec).decode()}


def test_desired_patch_applies_and_records_epoch() -> None:
    patch = decide.desired_patch(ers(), ds(5, 10, patch=3, replicas=4))
    assert patch is not None
    assert patch["spec"] == {"replicas": 4, "patchID": 3}
    rec = msgspec.json.decode(
        patch["metadata"]["annotations"][decide.ANNOTATION_APPLIED_DESIRED_STATE], type=decide.AppliedDesired
    )
    assert rec.epoch == 5 and rec.patch_id == 3


def test_older_epoch_never_overrides_newer() -> None:
    s = ers(replicas=4, patch_id=3, annotations=applied_ann(5, 10))
    assert decide.desired_patch(s, ds(4, 20)) is None  # deposed leader, even if later
    assert decide.desired_patch(s, ds(6, 0)) is not None  # new leader, even with an earlier clock
    assert decide.desired_patch(s, ds(5, 9)) is None  # same epoch: older message loses
    assert decide.desired_patch(s, ds(5, 11, patch=4)) is not None  # same epoch: latest wins


def test_epoch_reset_heals_after_grace() -> None:
    s = ers(annotations=applied_ann(50, 0))
    assert decide.desired_patch(s, ds(2, 60)) is None
    assert decide.desired_patch(s, ds(2, 300)) is not None


def test_same_message_is_noop_and_garbled_record_is_no_record() -> None:
    msg = ds(5, 10, patch=3, replicas=4)
    s = ers(replicas=4, patch_id=3, annotations=applied_ann(5, 10, patch=3, replicas=4))
    assert decide.desired_patch(s, msg) is None
    assert decide.desired_patch(ers(annotations={decide.ANNOTATION_APPLIED_DESIRED_STATE: "{garbage"}), msg) is not None


def test_newer_desired_and_problems() -> None:
    a, b = ds(1, 50), ds(2, 0)
    assert decide.newer_desired(a, b) is b and decide.newer_desired(b, a) is b
    assert decide.newer_desired(None, a) is a
    assert decide.desired_problem(ds(1, 0, replicas=-1))
    assert decide.desired_problem(ds(1, 0)) is None


# --- the runner object ------------------------------------------------------------------------------


def test_new_runner_carries_annotations_owner_labels_finalizers() -> None:
    s = ers(
        replicas=1,
        patch_id=7,
        revision=3,
        annotations={"a": "1", decide.ANNOTATION_APPLIED_DESIRED_STATE: "x"},
        labels={"actions.github.com/scale-set-name": "set"},
    )
    body = decide.new_runner(s)
    meta = body["metadata"]
    assert meta["generateName"] == "set-runner-"
    assert meta["annotations"][ANNOTATION_PATCH_ID] == "7"
    assert meta["annotations"][ANNOTATION_ACTIONABLE_REVISION] == "3"
    assert meta["annotations"]["a"] == "1" and decide.ANNOTATION_APPLIED_DESIRED_STATE not in meta["annotations"]
    assert meta["labels"]["app.kubernetes.io/component"] == "runner"
    assert meta["labels"]["actions.github.com/scale-set-name"] == "set"
    assert meta["finalizers"] == [FINALIZER_EPHEMERAL_RUNNER, FINALIZER_RUNNER_REGISTRATION]
    (ref,) = meta["ownerReferences"]
    assert ref["uid"] == "ers-uid" and ref["controller"] is True and ref["kind"] == "EphemeralRunnerSet"
    assert body["spec"]["runnerScaleSetId"] == 1 and body["spec"]["githubConfigUrl"] == "https://github.com/org"
    decode(EphemeralRunner, {**body, "metadata": {**meta, "name": "x"}})  # a valid object


def test_deletion_plan() -> None:
    assert decide.plan_deletion(decide.bucket_runners([])).remove_finalizer
    busy = er("Running", runner_id=1, job="j")
    idle = er("Running", runner_id=2)
    fin = er("Succeeded")
    dp = decide.plan_deletion(decide.bucket_runners([busy, idle, fin]))
    assert not dp.remove_finalizer and dp.delete == [fin] and dp.remove == [idle]


def test_status_diff_only_when_different() -> None:
    s = ers(replicas=1)
    b = decide.bucket_runners([er("Running", runner_id=1)])
    wanted = decide.desired_status(s, b, 0)
    diff = decide.status_diff(s.status, wanted)
    assert diff == {"currentReplicas": 1, "runningEphemeralRunners": 1}
    assert s.status is not None
    s.status.current_replicas = 1
    s.status.running_ephemeral_runners = 1
    assert decide.status_diff(s.status, wanted) is None


def test_proxy_secret_data_is_arcs_to_secret_data() -> None:
    from shared.api import ProxyConfig, ProxyServerConfig

    proxy = ProxyConfig(
        http=ProxyServerConfig(url="http://proxy.example:3128", credential_secret_ref="creds"),
        no_proxy=["a.example", "b.example"],
    )
    assert decide.proxy_secret_data(proxy, {"creds": ("test", "pass word")}) == {
        "http_proxy": "http://test:pass%20word@proxy.example:3128",
        "https_proxy": "",
        "no_proxy": "a.example,b.example",
    }
    s = ers(replicas=1)
    assert decide.new_runner(s, "set-abc-runner-proxy")["spec"]["proxySecretRef"] == "set-abc-runner-proxy"
    assert "proxySecretRef" not in decide.new_runner(s)["spec"]


def test_a_later_identical_message_writes_nothing() -> None:
    """The listener republishes its desired state every poll: only a change of epoch, patch ID or
    replicas writes the ERS (not a fresh time)."""
    s = ers(replicas=4, patch_id=3, annotations=applied_ann(5, 10, patch=3, replicas=4))
    assert decide.desired_patch(s, ds(5, 11, patch=3, replicas=4)) is None
    assert decide.desired_patch(s, ds(5, 500, patch=3, replicas=4)) is None
    assert decide.desired_patch(s, ds(6, 11, patch=3, replicas=4)) is not None  # new epoch is recorded
    assert decide.desired_patch(s, ds(5, 11, patch=4, replicas=4)) is not None
    assert decide.desired_patch(s, ds(5, 11, patch=3, replicas=5)) is not None
    # a record that disagrees with the spec is rewritten so that it stays true
    assert decide.desired_patch(
        ers(replicas=4, patch_id=3, annotations=applied_ann(5, 10)), ds(5, 11, patch=3, replicas=4)
    )


# --- finished runners the listener has / has not accounted for (issue #14) -----------------------


def _finished(
    *,
    completed_at: dt.datetime | None = None,
    epoch: int = 4,
    finished_at: dt.datetime | None = T0,
    patch: int = 1,
    legacy_mark: bool = False,
) -> EphemeralRunner:
    r = er("Succeeded", runner_id=9, job="j", patch=patch)
    if finished_at is not None:
        r.metadata.annotations[ANNOTATION_FINISHED_AT] = finished_at.isoformat()
    if completed_at is not None:
        r.metadata.annotations[ANNOTATION_JOB_COMPLETED] = (
            f"job=j;result=succeeded;at={completed_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            if legacy_mark
            else finished_mod.completion_value("j", "succeeded", completed_at, epoch)
        )
    return r


def _applied(*, epoch: int = 4, time: dt.datetime, patch: int, replicas: int) -> dict[str, str]:
    rec = decide.AppliedDesired(epoch=epoch, time=time, patch_id=patch, replicas=replicas)
    return {decide.ANNOTATION_APPLIED_DESIRED_STATE: msgspec.json.encode(rec).decode()}


def test_finished_state_accounted_only_by_a_desired_state_computed_after_the_completion() -> None:
    done = T0 + dt.timedelta(milliseconds=700)
    r = _finished(completed_at=done)
    rec = decide.parse_applied_desired
    state = decide.finished_state
    now = T0 + dt.timedelta(seconds=1)
    # same epoch, desired state older than the completion (another job's message): held
    a = rec(_applied(time=T0 + dt.timedelta(milliseconds=500), patch=9, replicas=2))
    assert state(r, a, 9, now)[0] is decide.Finished.HELD
    # same epoch, at or after the completion: accounted
    a = rec(_applied(time=done, patch=10, replicas=0))
    assert state(r, a, 10, now)[0] is decide.Finished.ACCOUNTED
    # a later epoch (new listener, fresh statistics) accounts for it; an earlier one does not
    a = rec(_applied(epoch=5, time=T0, patch=1, replicas=0))
    assert state(r, a, 1, now)[0] is decide.Finished.ACCOUNTED
    a = rec(_applied(epoch=3, time=done + dt.timedelta(seconds=5), patch=1, replicas=0))
    assert state(r, a, 1, now)[0] is decide.Finished.HELD
    # no mark yet (the runner exited before the JobCompleted arrived): held, then expired after the hold
    bare = _finished()
    a = rec(_applied(time=done + dt.timedelta(seconds=5), patch=9, replicas=2))
    st, left = state(bare, a, 9, now)
    assert st is decide.Finished.HELD and left == pytest.approx(59.0)
    assert state(bare, a, 9, T0 + decide.FINISHED_HOLD)[0] is decide.Finished.EXPIRED
    # patch ID 0: the listener saw nothing since its last decision and sits at minRunners
    assert state(bare, None, 0, now)[0] is decide.Finished.ACCOUNTED
    # Succeeded without the runner worker's stamp (ARC, a user): reaped at once, as the seeds do
    assert state(er("Succeeded"), a, 9, now)[0] is decide.Finished.EXPIRED
    # an older mark (whole seconds, no epoch) needs a desired state a full second later
    old = _finished(completed_at=done, legacy_mark=True)
    a = rec(_applied(time=T0 + dt.timedelta(milliseconds=900), patch=9, replicas=2))
    assert state(old, a, 9, now)[0] is decide.Finished.HELD
    a = rec(_applied(time=T0 + dt.timedelta(seconds=1), patch=9, replicas=2))
    assert state(old, a, 9, now)[0] is decide.Finished.ACCOUNTED


def test_finished_time_is_read_from_status_and_from_the_older_annotation() -> None:
    """The runner worker writes the finished time in status (one patch with phase Succeeded);
    runners finished by older versions carry the annotation instead: both are held, none is
    reaped at once as an unstamped (ARC) runner would be; status wins when both are there."""
    now = T0 + dt.timedelta(seconds=1)
    a = decide.parse_applied_desired(_applied(time=T0 + dt.timedelta(seconds=5), patch=9, replicas=2))
    in_status = _finished(finished_at=None)
    assert in_status.status is not None
    in_status.status.finished_at = T0
    st, left = decide.finished_state(in_status, a, 9, now)
    assert st is decide.Finished.HELD and left == pytest.approx(59.0)
    assert finished_mod.finished_time(in_status) == T0
    legacy = _finished(finished_at=T0)  # annotation only (an upgrade must not strand it)
    assert decide.finished_state(legacy, a, 9, now)[0] is decide.Finished.HELD
    both = _finished(finished_at=T0 - dt.timedelta(hours=1))
    assert both.status is not None
    both.status.finished_at = T0
    assert finished_mod.finished_time(both) == T0
    assert decide.finished_state(both, a, 9, now)[0] is decide.Finished.HELD


def test_held_finished_runners_count_toward_scale_up_accounted_ones_reaped_without_marker() -> None:
    done = T0 + dt.timedelta(milliseconds=100)
    one = _finished(completed_at=done, patch=8)
    two, three = _finished(patch=8), _finished(patch=8)  # no JobCompleted yet
    s = ers(replicas=2, patch_id=9, annotations=_applied(time=done + dt.timedelta(milliseconds=1), patch=9, replicas=2))
    now = T0 + dt.timedelta(seconds=1)
    p = decide.plan(s, decide.bucket_runners([one, two, three]), now)
    # the accounted one is reaped; no gap opens, so no marker (scale-up is not suppressed)
    assert p.reason == "finished-cleanup" and p.delete == [one]
    assert not p.status or "finishedRunnerCleanupPatchID" not in p.status
    # next pass: two held runners still stand for jobs spec.replicas counts: nothing is created
    p = decide.plan(s, decide.bucket_runners([two, three]), now)
    assert p.create == 0 and p.reason == "steady"
    assert p.requeue_after == pytest.approx(59.0)  # woken when the hold runs out
    # a new job arrives meanwhile: only the missing runner is created
    s3 = ers(replicas=3, patch_id=11, annotations=_applied(time=done, patch=11, replicas=3))
    p = decide.plan(s3, decide.bucket_runners([two, three]), now)
    assert p.create == 1
    # the hold runs out (listener down): reaped with the seeds' marker, scale-up suppressed at that patch
    p = decide.plan(s, decide.bucket_runners([two, three]), T0 + decide.FINISHED_HOLD)
    assert p.reason == "finished-cleanup" and p.delete == [two, three]
    assert p.status is not None
    assert p.status["finishedRunnerCleanupPatchID"] == 9


def test_revision_rollout_leaves_finished_runners_to_the_finished_step() -> None:
    fin = _finished(patch=1)
    fin.metadata.annotations[ANNOTATION_ACTIONABLE_REVISION] = "1"
    p = decide.plan(ers(replicas=1, patch_id=2, revision=2, applied=1), decide.bucket_runners([fin]), T0)
    assert p.reason == "revision-applied"


def test_parked_outdated_set_drains_idle_runners_busy_ones_finish() -> None:
    outdated = er("Outdated", revision=2)
    idle = er("Running", runner_id=1, revision=2)
    busy = er("Running", runner_id=2, job="j", revision=2)
    unregistered = er("Pending", revision=2)
    # parked by the scale-set worker: replicas 0, patch ID 0 (authoritative)
    p = plan_for(ers(replicas=0, patch_id=0, revision=2, applied=2), [outdated, idle, busy, unregistered])
    assert p.reason == "outdated-hold" and p.create == 0
    assert p.remove == [idle] and p.remove_count == 3
    # not parked yet (a listener still publishes): held, nothing removed
    p = plan_for(ers(replicas=3, patch_id=5, revision=2, applied=2), [outdated, idle, busy, unregistered])
    assert p.reason == "outdated-hold" and not p.remove and p.create == 0


# --- maxRunners guard (issue 11) -----------------------------------------------------------------


def _owned(
    max_runners: int | None, *, uid: str = "ars-uid", kind: str = "AutoscalingRunnerSet"
) -> tuple[EphemeralRunnerSet, AutoscalingRunnerSet]:
    tree = to_dict(ers())
    tree["metadata"]["ownerReferences"] = [
        {"apiVersion": "actions.github.com/v1alpha1", "kind": kind, "name": "set", "uid": "ars-uid", "controller": True}
    ]
    the_ers = decode(EphemeralRunnerSet, tree)
    ars_tree: dict[str, Any] = {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": "set", "namespace": "ns", "uid": uid},
        "spec": {"githubConfigUrl": "https://github.com/org", "githubConfigSecret": "s"},
    }
    if max_runners is not None:
        ars_tree["spec"]["maxRunners"] = max_runners
    return the_ers, decode(AutoscalingRunnerSet, ars_tree)


def test_max_runners_comes_from_the_controlling_ars_only() -> None:
    assert decide.max_runners_of(*_owned(10)) == 10
    assert decide.max_runners_of(*_owned(None)) is None  # no maxRunners: no cap
    assert decide.max_runners_of(*_owned(10, uid="other")) is None  # a namesake, not the owner
    assert decide.max_runners_of(*_owned(10, kind="Something")) is None
    assert decide.max_runners_of(ers(), _owned(10)[1]) is None  # no owner reference
    assert decide.max_runners_of(_owned(10)[0], None) is None


def test_desired_state_above_max_runners_is_clamped() -> None:
    msg = ds(5, 10, patch=3, replicas=25)
    clamped = decide.clamp_desired(msg, 10)
    assert clamped is not None and clamped.replicas == 10 and clamped.patch_id == 3
    assert decide.clamp_desired(msg, None) is None
    assert decide.clamp_desired(ds(5, 10, patch=3, replicas=10), 10) is None
    patch = decide.desired_patch(ers(), clamped)
    assert patch is not None and patch["spec"] == {"replicas": 10, "patchID": 3}


def test_creation_never_exceeds_max_runners() -> None:
    assert decide.cap_create(24, 1, 10) == 9
    assert decide.cap_create(3, 1, 10) == 3
    assert decide.cap_create(3, 12, 10) == 0
    assert decide.cap_create(3, 1, None) == 3


# --- status write coalescing (README "runner-set worker", status writes) -------------------------


def test_count_only_status_waits_for_the_window_since_the_last_write() -> None:
    counts = {"currentReplicas": 3, "runningEphemeralRunners": 2}
    assert decide.status_wait(counts, None) == 0.0  # no write yet: now
    assert decide.status_wait(counts, 0.25, window=1.0) == pytest.approx(0.75)
    assert decide.status_wait(counts, 1.0, window=1.0) == 0.0
    assert decide.status_wait(counts, 5.0, window=1.0) == 0.0
    assert decide.status_wait(None, 0.0) == 0.0


@pytest.mark.parametrize(
    "fields",
    [
        {"phase": "Outdated"},
        {"currentReplicas": 1, "phase": "Running"},
        {"currentReplicas": 1, "finishedRunnerCleanupPatchID": 7},
        {"appliedActionableRevision": 2, "finishedRunnerCleanupPatchID": None},
    ],
)
def test_phase_revision_and_marker_are_never_held_back(fields: dict[str, Any]) -> None:
    assert decide.status_wait(fields, 0.0, window=1.0) == 0.0


# --- completions heard from the bus (README "Typed state (new fields)") -----------------------------------


def _completed(
    r: EphemeralRunner, *, at: dt.datetime, runner_id: int = 9, job: str = "j", epoch: int = 4
) -> JobCompleted:
    return JobCompleted(
        scale_set_id=1,
        scale_set=ResourceRef("ns", "set"),
        runner_name=r.metadata.name,
        runner_id=runner_id,
        job_id=job,
        listener_epoch=epoch,
        result="succeeded",
        time=at,
    )


def test_heard_completion_accounts_like_the_mark_and_only_for_this_registration() -> None:
    done = T0 + dt.timedelta(milliseconds=700)
    r = _finished()  # no job-completed mark: the runner worker has not written it yet
    now = T0 + dt.timedelta(seconds=1)
    heard = decide.heard_completion(r, _completed(r, at=done))
    assert heard is not None and heard.job == "j" and heard.epoch == 4
    before = decide.parse_applied_desired(_applied(time=T0 + dt.timedelta(milliseconds=500), patch=9, replicas=2))
    after = decide.parse_applied_desired(_applied(time=done, patch=9, replicas=2))
    # without it: held until the mark or the hold; with it: the same rule as the mark
    assert decide.finished_state(r, after, 9, now)[0] is decide.Finished.HELD
    assert decide.finished_state(r, before, 9, now, heard)[0] is decide.Finished.HELD
    assert decide.finished_state(r, after, 9, now, heard)[0] is decide.Finished.ACCOUNTED
    # another registration of the same name, another job, no runner id: not this runner's completion
    assert decide.heard_completion(r, _completed(r, at=done, runner_id=10)) is None
    assert decide.heard_completion(r, _completed(r, at=done, runner_id=0)) is None
    assert decide.heard_completion(r, _completed(r, at=done, job="other")) is None
    unregistered = er("Succeeded", job="j")
    assert decide.heard_completion(unregistered, _completed(unregistered, at=done, runner_id=0)) is None


def test_plan_reaps_a_finished_runner_heard_completed_without_the_marker() -> None:
    done = T0 + dt.timedelta(milliseconds=700)
    r = _finished(patch=8)
    s = ers(replicas=0, patch_id=9, annotations=_applied(time=done, patch=9, replicas=0))
    b = decide.bucket_runners([r])
    now = T0 + dt.timedelta(seconds=1)
    held = decide.plan(s, b, now)
    assert r not in held.delete
    heard = decide.heard_completion(r, _completed(r, at=done))
    assert heard is not None
    p = decide.plan(s, b, now, heard={r.metadata.uid: heard})
    assert p.reason == "finished-cleanup" and p.delete == [r]
    assert not (p.status or {}).get("finishedRunnerCleanupPatchID")
