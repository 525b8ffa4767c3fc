"""The simulator's synchronous core: state transitions and pure decisions, without HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from services.embedded.actions_sim import wire
from services.embedded.actions_sim.faults import FaultBook, FaultRuleError
from services.embedded.actions_sim.jitconfig import JitConfigError, decode_jit_config
from services.embedded.actions_sim.views import FaultRule, JobSpec, SimSettings
from services.embedded.actions_sim.world import (
    MESSAGE_ID_BASE,
    RunnerRecord,
    ScopeRef,
    Seed,
    ServiceFault,
    StoredMessage,
    World,
    compute_statistics,
    is_outdated,
    labels_match,
    parse_scope_path,
    rfc3339,
)

T0 = 1_800_000_000.0


def make_world(**settings: object) -> tuple[World, int, int]:
    world = World(Seed(), SimSettings(**settings))  # type: ignore[arg-type]
    tenant = world.tenant_for(ScopeRef("org", "octo-org"))
    scale_set = world.create_scale_set(tenant.id, wire.ScaleSetRequest(name="linux"), now=T0)
    return world, tenant.id, scale_set.id


def events_of(message: StoredMessage) -> list[wire.JobMessage]:
    return msgspec.json.decode(message.body, type=list[wire.JobMessage]) if message.body else []


def drain(world: World, scale_set_id: int) -> list[wire.JobMessage]:
    out: list[wire.JobMessage] = []
    last = 0
    while (m := world.next_message(scale_set_id, last)) is not None:
        out += events_of(m)
        world.ack_message(scale_set_id, m.message_id)
        last = m.message_id
    return out


def connect_runner(world: World, tenant: int, scale_set_id: int, name: str, version: str = "2.330.0") -> RunnerRecord:
    runner = world.register_runner(tenant, scale_set_id, name, f"token-{name}", now=T0)
    assert world.runner_connect(runner, version)
    return runner


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/octo-org", ScopeRef("org", "octo-org")),
        ("/octo-org/repo/", ScopeRef("repo", "octo-org", "repo")),
        ("/Enterprises/big", ScopeRef("enterprise", "big")),
        ("/", None),
        ("/a/b/c", None),
    ],
)
def test_config_url_paths_map_to_scopes(path: str, expected: ScopeRef | None) -> None:
    assert parse_scope_path(path) == expected


def test_labels_match_needs_every_job_label_case_insensitively() -> None:
    labels = [wire.Label(name="linux"), wire.Label(name="GPU")]
    assert labels_match(["gpu", "Linux"], labels)
    assert not labels_match(["linux", "arm64"], labels)
    assert not labels_match([], labels)


def test_version_comparison_is_numeric() -> None:
    assert is_outdated("2.9.0", "2.10.0")
    assert not is_outdated("v2.330.1", "2.330.0")
    assert not is_outdated("1.0.0", "")
    assert is_outdated("garbage", "2.0.0")


def test_times_have_seven_fractional_digits_and_zero_time_when_unset() -> None:
    assert rfc3339(1_700_000_000.5) == "2023-11-14T22:13:20.5000000Z"
    assert rfc3339(None) == wire.ZERO_TIME


def test_statistics_invariants_hold() -> None:
    world, tenant, ss = make_world()
    world.enqueue_jobs(JobSpec(count=3, labels=["linux"]), now=T0)
    runner = connect_runner(world, tenant, ss, "r1")
    connect_runner(world, tenant, ss, "r2")
    world.settle(now=T0)
    world.job_started(runner, runner.job_id, now=T0)
    stats = world.statistics(ss)
    assert stats.total_assigned_jobs == 3
    assert stats.total_running_jobs == 1
    assert stats.total_registered_runners == 2
    assert stats.total_busy_runners == 2  # both runners got a job; one has not started yet
    assert stats.total_idle_runners == 0
    assert stats.total_assigned_jobs >= stats.total_running_jobs
    assert stats.total_registered_runners == stats.total_busy_runners + stats.total_idle_runners


def test_job_lifecycle_emits_assigned_started_completed_and_deregisters_runner() -> None:
    world, tenant, ss = make_world()
    [job] = world.enqueue_jobs(JobSpec(labels=["linux"], result="failed"), now=T0)
    world.settle(now=T0)
    runner = connect_runner(world, tenant, ss, "r1")
    world.settle(now=T0 + 1)
    assert runner.job_id == job.job_id
    world.job_started(runner, job.job_id, now=T0 + 2)
    world.job_started(runner, job.job_id, now=T0 + 2)  # repeated report: no second event
    world.job_completed(runner, job.job_id, "", now=T0 + 3)
    events = drain(world, ss)
    assert [type(e).__name__ for e in events] == ["JobAssigned", "JobStarted", "JobCompleted"]
    started, completed = events[1], events[2]
    assert isinstance(started, wire.JobStarted) and started.runner_name == "r1" and started.runner_id == runner.id
    assert isinstance(completed, wire.JobCompleted) and completed.result == "failed"
    assert completed.finish_time != wire.ZERO_TIME
    assert all(e.job_id == job.job_id and e.owner_name == "octo-org" for e in events)
    assert runner.id not in world.runners
    assert world.statistics(ss) == wire.Statistics()


def test_capacity_caps_assignment_and_zero_pauses_it() -> None:
    world, _, ss = make_world()
    world.set_capacity(ss, 0)
    world.enqueue_jobs(JobSpec(count=5, labels=["linux"]), now=T0)
    world.settle(now=T0)
    assert world.statistics(ss).total_assigned_jobs == 0
    world.set_capacity(ss, 2)
    world.settle(now=T0)
    assert world.statistics(ss).total_assigned_jobs == 2
    world.set_capacity(ss, 10)
    world.settle(now=T0)
    assert world.statistics(ss).total_assigned_jobs == 5


def test_messages_batch_at_most_50_events_and_unacked_are_redelivered() -> None:
    world, _, ss = make_world()
    world.enqueue_jobs(JobSpec(count=120, labels=["linux"]), now=T0)
    world.settle(now=T0)
    first = world.next_message(ss, 0)
    assert first is not None and first.message_id == MESSAGE_ID_BASE + 1
    assert len(events_of(first)) == 50
    assert first.statistics.total_assigned_jobs == 120
    # Not acked: a poll from scratch (lastMessageId 0) gets the same message again.
    assert world.next_message(ss, 0) is first
    second = world.next_message(ss, first.message_id)
    assert second is not None and second.message_id > first.message_id
    world.ack_message(ss, first.message_id)
    world.ack_message(ss, first.message_id)  # a retried ack is harmless
    assert world.next_message(ss, 0) is second
    with pytest.raises(ServiceFault) as err:
        world.ack_message(ss, 1)
    assert err.value.status == 404


def test_ghes_mode_needs_acquire_before_assignment() -> None:
    world, _, ss = make_world(mode="ghes")
    [job] = world.enqueue_jobs(JobSpec(labels=["linux"]), now=T0)
    world.settle(now=T0)
    assert world.statistics(ss).total_available_jobs == 1
    assert world.acquire_jobs(ss, [job.runner_request_id, 999]) == [job.runner_request_id]
    assert world.acquire_jobs(ss, [job.runner_request_id]) == []  # already acquired
    world.settle(now=T0)
    types = [type(e).__name__ for e in drain(world, ss)]
    assert types == ["JobAvailable", "JobAssigned"]
    assert world.statistics(ss).total_assigned_jobs == 1


def test_unstarted_assignment_is_cancelled_and_reassigned_then_given_up() -> None:
    world, _, ss = make_world(assign_timeout=10.0)
    [job] = world.enqueue_jobs(JobSpec(labels=["linux"]), now=T0)
    t = T0
    world.settle(now=t)
    for attempt in range(1, 5):
        deadline = world.next_deadline()
        assert deadline is not None
        t = deadline
        world.settle(now=t)
        assert job.attempts == attempt
    assert job.state == "completed" and job.final_result == "canceled"
    types = [type(e).__name__ for e in drain(world, ss)]
    assert types == ["JobAssigned", "JobCompleted"] * 4
    assert world.next_deadline() is None


def test_session_conflict_and_idle_expiry() -> None:
    world, tenant, ss = make_world(session_idle_timeout=60.0)
    session = world.create_session(tenant, ss, "host-a", now=T0)
    with pytest.raises(ServiceFault) as err:
        world.create_session(tenant, ss, "host-b", now=T0)
    assert err.value.status == 409 and "already has an active session" in err.value.message
    world.settle(now=T0 + 61)
    assert session.session_id not in world.sessions
    world.create_session(tenant, ss, "host-b", now=T0 + 61)


def test_remove_busy_runner_is_job_still_running_with_configured_status() -> None:
    world, tenant, ss = make_world(job_still_running_status=409)
    world.enqueue_jobs(JobSpec(labels=["linux"]), now=T0)
    runner = connect_runner(world, tenant, ss, "r1")
    world.settle(now=T0)
    with pytest.raises(ServiceFault) as err:
        world.remove_runner(tenant, runner.id)
    assert err.value.status == 409 and "JobStillRunningException" in err.value.type_name


def test_removing_a_gone_runner_is_agent_not_found() -> None:
    world, tenant, ss = make_world()
    runner = world.register_runner(tenant, ss, "r1", "tok", now=T0)
    world.remove_runner(tenant, runner.id)
    for gone in (runner.id, 999_999):  # as the service: A10 on an unknown id is 404
        with pytest.raises(ServiceFault) as gone_err:
            world.remove_runner(tenant, gone)
        assert gone_err.value.status == 404 and "AgentNotFoundException" in gone_err.value.type_name
    with pytest.raises(ServiceFault) as err:
        world.runner(tenant, runner.id)
    assert err.value.status == 404


def test_outdated_runner_is_rejected_and_never_gets_a_job() -> None:
    world, tenant, ss = make_world(min_runner_version="2.330.0")
    world.enqueue_jobs(JobSpec(labels=["linux"]), now=T0)
    runner = world.register_runner(tenant, ss, "old", "tok", now=T0)
    assert not world.runner_connect(runner, "2.300.0")
    world.settle(now=T0)
    assert runner.status == "outdated" and runner.job_id == ""


def test_deleting_a_scale_set_requeues_its_jobs_to_another_match() -> None:
    world, tenant, ss = make_world()
    other = world.create_scale_set(tenant, wire.ScaleSetRequest(name="linux-2", labels=[wire.Label("linux")]), now=T0)
    [job] = world.enqueue_jobs(JobSpec(labels=["linux"]), now=T0)
    world.settle(now=T0)
    assert job.scale_set_id == ss
    world.delete_scale_set(tenant, ss)
    world.settle(now=T0)
    assert job.scale_set_id == other.id and job.state == "assigned"


def test_duplicate_name_and_partial_update() -> None:
    world, tenant, ss = make_world()
    with pytest.raises(ServiceFault) as err:
        world.create_scale_set(tenant, wire.ScaleSetRequest(name="linux"), now=T0)
    assert err.value.status == 409
    patch = msgspec.json.decode(
        b'{"runnerGroupId":0,"RunnerSetting":{},"createdOn":"0001-01-01T00:00:00Z","name":"renamed"}',
        type=wire.ScaleSetRequest,
    )
    record = world.update_scale_set(tenant, ss, patch)
    assert record.name == "renamed" and record.runner_group_id == 1
    assert record.runner_setting == wire.RunnerSetting()  # an empty RunnerSetting changes nothing


def test_fault_rules_match_by_endpoint_alias_and_count() -> None:
    book = FaultBook()
    book.add(FaultRule(endpoint="Q1", status=503, count=2))
    assert book.take("get_message", "GET") is not None
    assert book.take("delete_message", "DELETE") is None
    assert book.take("get_message", "GET") is not None
    assert book.take("get_message", "GET") is None
    book.add(FaultRule(endpoint="*", count=None))
    assert book.take("runner_connect", "POST") is None  # fake runners are not the service
    assert book.take("create_session", "POST") is not None
    with pytest.raises(FaultRuleError, match="endpoint"):
        book.add(FaultRule(endpoint="nope"))
    with pytest.raises(FaultRuleError, match="get_message"):
        book.add(FaultRule(endpoint="create_session", kind="redeliver"))


def test_jit_config_decoding_rejects_garbage_without_echoing_it() -> None:
    with pytest.raises(JitConfigError) as err:
        decode_jit_config("bm90LWpzb24=")
    assert "bm90" not in str(err.value)


def test_compute_statistics_ignores_other_scale_sets() -> None:
    assert compute_statistics(1, [], []) == wire.Statistics()


def test_acked_messages_beyond_the_inspection_window_are_forgotten() -> None:
    world, _, ss = make_world()
    ids = [world.inject_message(ss, body="", statistics=None, message_type=None).message_id for _ in range(1005)]
    unacked_first = ids[0]
    for message_id in ids[1:]:
        world.ack_message(ss, message_id)
    kept = world.queues[ss].messages
    assert len(kept) <= 1001 and kept[0].message_id == unacked_first  # unacked ones are never dropped
    first = world.next_message(ss, 0)
    assert first is not None and first.message_id == unacked_first


class _NotToWalk(list[StoredMessage]):
    """A queue's kept messages that fail the test when walked."""

    def __iter__(self) -> Iterator[StoredMessage]:
        raise AssertionError("the kept messages were walked")


def test_polls_and_acks_do_not_walk_the_kept_acked_messages() -> None:
    # Issue 10: a burst of N runners makes ~N messages; every poll, wake-up and ack walked all
    # of the up to 1,000 kept ones, O(N) per request.
    world, _, ss = make_world()
    ids = [world.inject_message(ss, body="", statistics=None, message_type=None).message_id for _ in range(1000)]
    for message_id in ids:
        world.ack_message(ss, message_id)
    queue = world.queues[ss]
    queue.messages = _NotToWalk(queue.messages)
    assert world.next_message(ss, ids[-1]) is None
    new = world.inject_message(ss, body="", statistics=None, message_type=None)
    assert world.next_message(ss, ids[-1]) is new
    assert world.next_message(ss, 0) is new  # a poll from scratch gets the oldest unacked one
    world.ack_message(ss, new.message_id)
    assert world.next_message(ss, 0) is None
    assert new.acked and len(queue.messages) == 1000  # acked, and still kept for inspection


def test_jobs_route_only_to_scale_sets_whose_scope_covers_the_repository() -> None:
    world = World(Seed(orgs=["octo-org", "other-org"]), SimSettings())
    repo_tenant = world.tenant_for(ScopeRef("repo", "octo-org", "octo-repo"))
    ent_tenant = world.tenant_for(ScopeRef("enterprise", "octo-enterprise"))
    repo_set = world.create_scale_set(repo_tenant.id, wire.ScaleSetRequest(name="linux"), now=T0)
    ent_set = world.create_scale_set(ent_tenant.id, wire.ScaleSetRequest(name="linux"), now=T0)
    [own] = world.enqueue_jobs(JobSpec(labels=["linux"], repository="octo-org/octo-repo"), now=T0)
    [sibling] = world.enqueue_jobs(JobSpec(labels=["linux"], repository="octo-org/elsewhere"), now=T0)
    [other_org] = world.enqueue_jobs(JobSpec(labels=["linux"], repository="other-org/x"), now=T0)
    [outsider] = world.enqueue_jobs(JobSpec(labels=["linux"], repository="stranger/x"), now=T0)
    world.settle(now=T0)
    assert own.scale_set_id == repo_set.id  # the oldest matching scale set wins
    assert sibling.scale_set_id == ent_set.id and other_org.scale_set_id == ent_set.id
    assert outsider.scale_set_id is None and outsider.state == "queued"
