"""The simulator's cheap paths (issue 10): settling only after a change or at a deadline, token
signatures checked once, runners found by token and name without a scan. Each still answers as
the full computation would."""

from __future__ import annotations

import random
from typing import Any

import anyio
import jwt
import pytest

from services.embedded.actions_sim import wire
from services.embedded.actions_sim.server import Simulator
from services.embedded.actions_sim.settings import SimConfig
from services.embedded.actions_sim.tokens import TokenError, TokenIssuer
from services.embedded.actions_sim.views import JobSpec, SimSettings
from services.embedded.actions_sim.world import RunnerRecord, ScopeRef, ServiceFault, World, compute_statistics
from tests.fixtures.actions_sim import _app_key_pem
from tests.sim.test_world import T0, connect_runner, drain, make_world


def _counted_settles(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    calls: list[float] = []
    real = sim.world.settle

    def settle(*, now: float) -> None:
        calls.append(now)
        real(now=now)

    monkeypatch.setattr(sim.world, "settle", settle)
    return calls


def test_settle_skips_an_unchanged_world_until_its_next_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = Simulator(SimConfig(app_private_key_pem=_app_key_pem(), settings=SimSettings(session_idle_timeout=30.0)))
    calls = _counted_settles(sim, monkeypatch)
    tenant = sim.world.tenant_for(ScopeRef("org", sim.config.seed.orgs[0]))
    scale_set = sim.world.create_scale_set(tenant.id, wire.ScaleSetRequest(name="linux"), now=sim.now())
    session = sim.world.create_session(tenant.id, scale_set.id, "host", now=sim.now())
    sim.settle()
    sim.settle()
    assert len(calls) == 1  # nothing changed, no deadline passed: the second settle is skipped
    sim.world.touch()
    sim.settle()
    assert len(calls) == 2
    sim.clock_offset += 31.0  # past the idle session's deadline: settled, the session expires
    sim.settle()
    assert len(calls) == 3
    assert session.session_id not in sim.world.sessions
    sim.settle(force=True)  # control calls change what the generation does not record
    assert len(calls) == 4


def test_a_token_signature_is_checked_once_and_expiry_on_every_use(monkeypatch: pytest.MonkeyPatch) -> None:
    issuer = TokenIssuer()
    token = issuer.mint_queue("s1", 7, now=T0, ttl=60)
    decodes: list[str] = []
    real = jwt.decode

    def decode(*args: Any, **kw: Any) -> Any:
        decodes.append(args[0])
        return real(*args, **kw)

    monkeypatch.setattr(jwt, "decode", decode)  # the module tokens.py calls through
    assert issuer.verify_queue(token, now=T0).scale_set_id == 7
    assert issuer.verify_queue(token, now=T0 + 1).session_id == "s1"
    assert len(decodes) == 1
    with pytest.raises(TokenError) as expired:
        issuer.verify_queue(token, now=T0 + 61)
    assert expired.value.expired
    with pytest.raises(TokenError):
        issuer.verify_admin(token, now=T0)  # a queue token is not an admin token, cached or not
    with pytest.raises(TokenError):
        issuer.verify_queue(token[:-2] + ("AA" if not token.endswith("AA") else "BB"), now=T0)


def test_runner_lookups_forget_removed_runners() -> None:
    world, tenant, scale_set_id = make_world()
    runner = world.register_runner(tenant, scale_set_id, "r1", "tok-1", now=T0)
    assert world.runner_by_token("tok-1") is runner
    with pytest.raises(ServiceFault) as exists:
        world.register_runner(tenant, scale_set_id, "r1", "tok-2", now=T0)
    assert exists.value.status == 409
    world.remove_runner(tenant, runner.id)
    assert world.runner_by_token("tok-1") is None
    again = world.register_runner(tenant, scale_set_id, "r1", "tok-3", now=T0)  # the name is free again
    assert world.runner_by_token("tok-3") is again
    assert world.runner_by_token("tok-1") is None
    for i in range(200):  # hints of removed runners do not pile up
        r = world.register_runner(tenant, scale_set_id, f"x{i}", f"t{i}", now=T0)
        world.remove_runner(tenant, r.id)
    assert len(world._runner_by_token) < 100  # 202 registered; pruned at 2 x live + 64


def test_started_jobs_count_against_capacity_and_come_back_when_their_scale_set_goes() -> None:
    """Settle walks only jobs not started; capacity still counts the started ones, and a started
    job requeued by its scale set's deletion is routed again, in queue order."""
    world, tenant, scale_set_id = make_world()
    world.set_capacity(scale_set_id, 2)
    jobs = world.enqueue_jobs(JobSpec(count=3, labels=["linux"]), now=T0)
    world.settle(now=T0)
    assert [j.state for j in jobs] == ["assigned", "assigned", "queued"]
    for i in range(2):
        runner = connect_runner(world, tenant, scale_set_id, f"r{i}")
        world.settle(now=T0)
        job = world.runner_job(runner)
        assert job is not None
        world.job_started(runner, job.job_id, now=T0)
    world.settle(now=T0)
    world.settle(now=T0)
    assert [j.state for j in jobs] == ["started", "started", "queued"]  # 2 started fill the capacity of 2
    world.set_capacity(scale_set_id, 3)
    world.settle(now=T0)
    assert jobs[2].state == "assigned"

    world.delete_scale_set(tenant, scale_set_id)
    other = world.create_scale_set(tenant, wire.ScaleSetRequest(name="linux"), now=T0)
    world.settle(now=T0)
    assert [(j.state, j.scale_set_id) for j in jobs] == [("assigned", other.id)] * 3
    events = drain(world, other.id)
    assert [type(e).__name__ for e in events] == ["JobAssigned"] * 3
    assert [e.job_id for e in events] == [j.job_id for j in jobs]  # in queue order


def _full_deadline(world: World) -> float | None:
    """The next deadline computed from every session and open job (what the indexes stand for)."""
    s = world.settings
    times = [x.last_active + s.session_idle_timeout for x in world.sessions.values() if x.polls_in_flight == 0]
    times += [
        j.scale_set_assign_time + s.assign_timeout * (j.attempts + 1)
        for j in world.open_jobs.values()
        if j.state == "assigned" and j.scale_set_assign_time is not None
    ]
    return min(times) if times else None


@pytest.mark.parametrize("mode", ["dotcom", "ghes"])
@pytest.mark.parametrize("seed", range(6))
def test_indexed_statistics_deadlines_and_dispatch_match_a_full_walk(mode: str, seed: int) -> None:
    """Random job and runner traffic (issue 10: statistics, deadlines and dispatch come from
    indexes kept with every change): after every step the statistics equal the count over every
    open job and runner, the next deadline the minimum over every assigned job, and a settled
    world leaves no ready job below capacity and no idle runner beside an assigned job waiting."""
    rng = random.Random(seed)
    world, tenant, ss = make_world(mode=mode, assign_timeout=5.0)
    world.set_capacity(ss, 6)
    now = T0
    runners: list[RunnerRecord] = []
    for step in range(400):
        op = rng.random()
        if op < 0.15:
            world.enqueue_jobs(JobSpec(count=rng.randint(1, 3), labels=["linux"], duration=1), now=now)
        elif op < 0.3:
            runner = world.register_runner(tenant, ss, f"r{step}", f"t{step}", now=now)
            runners.append(runner)
            if rng.random() < 0.8:
                world.runner_connect(runner, "2.330.0")
        elif op < 0.45 and runners:
            runner = rng.choice(runners)
            job = world.runner_job(runner)
            if job is not None and world.runners.get(runner.id) is runner:
                if job.state == "assigned":
                    world.job_started(runner, job.job_id, now=now)
                else:
                    world.job_completed(runner, job.job_id, "succeeded", now=now)
        elif op < 0.52 and runners:
            runner = rng.choice(runners)
            if world.runners.get(runner.id) is runner:
                world.runner_lost(runner, now=now)
                if rng.random() < 0.5:
                    world.runner_connect(runner, "2.330.0")
        elif op < 0.58 and runners:
            runner = rng.choice(runners)
            if world.runners.get(runner.id) is runner and not runner.job_id:
                world.remove_runner(tenant, runner.id)
        elif op < 0.66:
            ids = [j.runner_request_id for j in world.acquirable_jobs(ss)]
            world.acquire_jobs(ss, rng.sample(ids, k=len(ids) // 2 + 1) if ids else [])
        elif op < 0.72:
            world.set_capacity(ss, rng.randint(0, 8))
        elif op < 0.8:
            now += rng.choice([0.5, 2.0, 6.0])  # past some assignment deadlines
        else:
            drain(world, ss)
        assert world.next_deadline() == _full_deadline(world)
        world.settle(now=now)
        stats = world.statistics(ss)
        assert stats == compute_statistics(ss, list(world.open_jobs.values()), list(world.runners.values()))
        assert world.next_deadline() == _full_deadline(world)
        jobs = list(world.open_jobs.values())
        ready = "acquired" if mode == "ghes" else "queued"
        capacity = world.scale_sets[ss].max_capacity or 0
        if any(j.state == ready and j.scale_set_id == ss for j in jobs):
            assert stats.total_assigned_jobs >= capacity
        idle = [r for r in world.runners.values() if r.status == "idle"]
        waiting = [j for j in jobs if j.state == "assigned" and j.runner_id is None]
        assert not (idle and waiting)


@pytest.mark.anyio
async def test_a_runner_change_wakes_only_that_runners_job_poll() -> None:
    """A job long-poll waits on its runner's own event (issue 10): a job handed to one runner
    wakes that runner's poll, not every waiting runner's; a control call wakes them all."""
    sim = Simulator(SimConfig(app_private_key_pem=_app_key_pem()))
    tenant = sim.world.tenant_for(ScopeRef("org", sim.config.seed.orgs[0]))
    scale_set = sim.world.create_scale_set(tenant.id, wire.ScaleSetRequest(name="linux"), now=sim.now())
    first, second = (
        sim.world.register_runner(tenant.id, scale_set.id, name, f"token-{name}", now=sim.now())
        for name in ("first", "second")
    )
    for runner in (first, second):
        assert sim.world.runner_connect(runner, "2.330.0")
    sim.settle()
    woken: list[str] = []

    async def poll(runner: RunnerRecord) -> None:
        await sim.wait_for_runner(runner.id, 30.0)
        woken.append(runner.name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(poll, first)
        tg.start_soon(poll, second)
        await anyio.wait_all_tasks_blocked()
        sim.world.enqueue_jobs(JobSpec(count=1, labels=["linux"]), now=sim.now())
        sim.settle()  # the job goes to the first idle runner
        await anyio.wait_all_tasks_blocked()
        assert sim.world.runner_job(first) is not None
        assert woken == ["first"]
        sim.settle(force=True)
        await anyio.wait_all_tasks_blocked()
        assert woken == ["first", "second"]
