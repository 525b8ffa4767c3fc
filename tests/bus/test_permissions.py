"""The authenticated bus (README "Authentication and permissions"): a nats-server configured from
:mod:`shared.bus.permissions`, as the embedded default and the deploy manifests are, refuses a
process without credentials and refuses a component publishing on another's subjects."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import nats.errors
import nats.js.errors
import pytest

from shared.bus import (
    Bus,
    BusConfigConflict,
    BusSettings,
    BusUnavailable,
    LeaderLease,
    PublishFailed,
    ShardOwnership,
    subjects,
)
from shared.bus import bus as bus_module
from shared.bus import permissions as perms
from shared.bus.messages import (
    BusMessage,
    DesiredState,
    JobStarted,
    ResourceRef,
    RevisionApplied,
    RevisionPublished,
    subject_for,
)
from tests.bus.conftest import wait_for
from tests.fixtures.nats import NatsServer, _free_port, nats_server_binary

pytestmark = pytest.mark.anyio

ERS = ResourceRef("ci", "set-1")


@pytest.fixture
def passwords() -> dict[str, str]:
    return perms.generate_passwords()


@pytest.fixture
def auth_server(tmp_path: Path, passwords: dict[str, str]) -> Iterator[NatsServer]:
    conf = tmp_path / "nats.conf"
    conf.write_text(perms.render_authorization(passwords))
    server = NatsServer(port=_free_port(), store_dir=tmp_path / "js", extra_args=["-c", str(conf)])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _settings(
    server: NatsServer, passwords: dict[str, str], component: str | None, *, request_timeout: float = 0.5
) -> BusSettings:
    s = BusSettings(
        nats_urls=(server.url,),
        connect_timeout=4.0,  # a refused login is retried until then; under load the first try may be slow
        reconnect_wait=0.2,
        request_timeout=request_timeout,
        publish_deadline=1.5,
        lease_ttl=2.0,
        renew_interval=0.4,
    )
    if component is None:
        return s
    return msgspec.structs.replace(s, user=component, password=passwords[component])


def _desired() -> DesiredState:
    return DesiredState(scale_set_id=1, ers=ERS, patch_id=7, replicas=25, listener_epoch=1)


def _published() -> RevisionPublished:
    return RevisionPublished(ers=ERS, revision=3)


def test_every_component_publishes_only_through_the_jetstream_api_and_its_own_subjects() -> None:
    p = {c: perms.permissions_for(c) for c in perms.COMPONENTS}
    assert "runnerscale.desired.>" in p["listener"].publish
    for c in ("runner-set", "scale-set", "runner", "bus-setup", "observer"):
        assert not any(s.startswith("runnerscale.desired") for s in p[c].publish), c
    assert not any(s.startswith("runnerscale.revisions") for s in p["listener"].publish)
    assert p["observer"].publish == ()
    assert set(perms.authorization(perms.generate_passwords())["users"][0]) == {"user", "password", "permissions"}


def test_the_rendered_configuration_is_valid_for_nats_server(tmp_path: Path) -> None:
    conf = tmp_path / "nats.conf"
    conf.write_text(perms.render_authorization({c: f"${perms.password_env_var(c)}" for c in perms.COMPONENTS}))
    env = {perms.password_env_var(c): f"pw-{c}" for c in perms.COMPONENTS}
    done = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


async def test_a_process_without_credentials_is_refused_with_a_bus_error(
    auth_server: NatsServer, passwords: dict[str, str]
) -> None:
    with pytest.raises(BusUnavailable, match=r"cannot connect to NATS .*: authorization violation"):
        async with Bus.connect(_settings(auth_server, passwords, None)):
            pass


async def test_a_wrong_password_is_refused_without_leaking_it(
    auth_server: NatsServer, passwords: dict[str, str]
) -> None:
    bad = msgspec.structs.replace(_settings(auth_server, passwords, "listener"), password="not-the-password-42")
    with pytest.raises(BusUnavailable, match="authorization violation") as err:
        async with Bus.connect(bad):
            pass
    assert "not-the-password-42" not in str(err.value)


@pytest.mark.parametrize(
    ("component", "message"),
    [
        ("listener", _published()),  # the listener cannot wake the runner-set through revisions
        ("runner-set", _desired()),  # issue 11: a worker cannot fake the listener's desired state
        ("runner", _desired()),
        ("scale-set", RevisionApplied(ers=ERS, revision=3)),
        ("runner-set", JobStarted(scale_set_id=1, scale_set=ResourceRef("ci", "set"), runner_name="r", runner_id=1)),
        # the listener-pod worker hands listener pods the listener's user; its own may not publish as one
        ("listener-pod", _desired()),
        ("listener-pod", JobStarted(scale_set_id=1, scale_set=ResourceRef("ci", "set"), runner_name="r", runner_id=2)),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
async def test_a_component_cannot_publish_on_another_components_subject(
    auth_server: NatsServer, passwords: dict[str, str], component: str, message: BusMessage
) -> None:
    async with Bus.connect(_settings(auth_server, passwords, component)) as bus:
        with pytest.raises(PublishFailed):
            await bus.publish(message)
    # ... and nothing reached the stream (read as the bus-setup user, which may read every stream).
    async with Bus.connect(_settings(auth_server, passwords, "bus-setup")) as admin:
        assert await admin.last_message(subject_for(message)) is None


@pytest.mark.parametrize(
    ("component", "message"),
    [("listener", _desired()), ("scale-set", _published()), ("runner-set", RevisionApplied(ers=ERS, revision=3))],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
async def test_a_component_publishes_on_its_own_subjects(
    auth_server: NatsServer, passwords: dict[str, str], component: str, message: BusMessage
) -> None:
    async with Bus.connect(_settings(auth_server, passwords, component, request_timeout=5)) as bus:
        ack = await bus.publish(message)
        assert not ack.duplicate
    async with Bus.connect(_settings(auth_server, passwords, "bus-setup", request_timeout=5)) as admin:
        assert await admin.last_message(subject_for(message)) == message


def test_bus_secret_prints_a_fresh_password_per_component(capsys: pytest.CaptureFixture[str]) -> None:
    from shared.bus.cli import main

    assert main(["secret", "--namespace", "ci"]) == 0
    first = msgspec.json.decode(capsys.readouterr().out)
    assert (first["kind"], first["metadata"]["namespace"]) == ("Secret", "ci")
    assert set(first["stringData"]) == set(perms.COMPONENTS)
    assert main(["secret"]) == 0
    second = msgspec.json.decode(capsys.readouterr().out)
    assert all(len(pw) >= 24 and pw != second["stringData"][c] for c, pw in first["stringData"].items())


async def test_local_credentials_serve_the_procfile(tmp_path: Path) -> None:
    """`runnerscale bus local-credentials`: the server config and a password file per component;
    a worker with --nats-password-file connects; a second run keeps the passwords."""
    first = perms.write_local_credentials(tmp_path / "state")
    assert perms.write_local_credentials(tmp_path / "state") == first
    assert (tmp_path / "state" / "nats-runner.password").stat().st_mode & 0o077 == 0
    server = NatsServer(
        port=_free_port(), store_dir=tmp_path / "js", extra_args=["-c", str(tmp_path / "state" / "nats-auth.conf")]
    )
    server.start()
    try:
        settings = msgspec.structs.replace(
            _settings(server, first, None),
            user="runner",
            password_file=str(tmp_path / "state" / "nats-runner.password"),
        )
        async with Bus.connect(settings) as bus:
            assert bus.connected
        with pytest.raises(BusUnavailable):
            async with Bus.connect(msgspec.structs.replace(settings, user="scale-set")):
                pass
    finally:
        server.stop()


def test_a_password_and_a_password_file_are_one_too_many(tmp_path: Path) -> None:
    from shared.bus import SettingsError
    from shared.bus.settings import validate

    path = tmp_path / "pw"
    path.write_text("x\n")
    with pytest.raises(SettingsError, match="RUNNERSCALE_NATS_PASSWORD_FILE"):
        validate(BusSettings(user="runner", password="y", password_file=str(path)))
    assert BusSettings(user="runner", password_file=str(path)).effective_password == "x"


@pytest.mark.parametrize("component", ["listener", "runner-set"])
async def test_a_component_cannot_delete_or_purge_the_desired_stream(
    auth_server: NatsServer, passwords: dict[str, str], component: str
) -> None:
    """`$JS.API.>` minus what no runtime process does: deleting or purging a stream is refused."""
    import nats.js.errors

    from shared.bus import subjects

    async with Bus.connect(_settings(auth_server, passwords, component)) as bus:
        for call in (bus.js.delete_stream, bus.js.purge_stream):
            with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error, TimeoutError)):
                await call(subjects.DESIRED_STREAM.name)
        assert (await bus.js.stream_info(subjects.DESIRED_STREAM.name)).config.name == subjects.DESIRED_STREAM.name


# --- the JetStream API, narrowed per component (issue 11 item 3) ------------------------------------


def test_no_component_may_call_the_whole_jetstream_api_or_delete_anything() -> None:
    for component in perms.COMPONENTS:
        publish = perms.permissions_for(component).publish
        assert not any(s in ("$JS.API.>", ">") for s in publish), component
        assert not any(".DELETE." in s or ".PURGE." in s for s in publish), component
    assert all("runnerscale_shards" not in s for c in perms.COMPONENTS for s in perms.permissions_for(c).publish)


async def _consume_once(bus: Bus, consumer: subjects.ConsumerSpec, instance: str | None) -> None:
    async def handler(_: object) -> None:
        return None

    async with anyio.create_task_group() as tg:
        await tg.start(functools.partial(bus.consume, consumer, handler, instance=instance, fetch_timeout=0.5))
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("component", ["listener", "runner-set", "scale-set", "runner", "listener-pod"])
async def test_each_component_starts_and_does_its_work_with_only_its_permissions(
    auth_server: NatsServer, passwords: dict[str, str], component: str
) -> None:
    """On a fresh server each component creates what it uses at connect, and its consumers
    (shared and per replica), last-message reads, KV records and leases all work."""
    uses = perms.USES[component]
    async with Bus.connect(_settings(auth_server, passwords, component, request_timeout=5)) as bus:
        for consumer in uses.consumers:
            await _consume_once(bus, consumer, None)
            await _consume_once(bus, consumer, "replica.0")
        if subjects.DESIRED_STREAM in uses.reads:
            assert await bus.last_message(subjects.desired_subject("ci", "set-1")) is None
        if subjects.MEMBERS_BUCKET in uses.buckets:
            async with ShardOwnership.join(bus, component, replica_id="r-0", shards=4) as shards:
                await shards.wait_ready()
                await wait_for(lambda: shards.owned_shards() == frozenset(range(4)), timeout=15)
        if component == "listener":
            async with LeaderLease.join(bus, subjects.listener_lease_name("ci", "set"), replica_id="l-0") as lease:
                term = await lease.wait_leader()
                assert term.epoch > 0
            await bus.kv_put(subjects.SESSIONS_BUCKET, subjects.listener_session_key(1), b"{}")
            assert await bus.kv_get(subjects.SESSIONS_BUCKET, subjects.listener_session_key(1)) == b"{}"
            await bus.publish(_desired())
    async with Bus.connect(_settings(auth_server, passwords, "bus-setup", request_timeout=5), setup=False) as admin:
        existing = {s.config.name async for s in _streams(admin)}
    # Only what the component uses was created (issue 10: never the old runnerscale_shards bucket).
    assert existing == {s.name for s in (*uses.streams, *uses.checks)} | {f"KV_{b}" for b in uses.buckets}


async def _streams(bus: Bus) -> AsyncIterator[Any]:
    for info in await bus.js.streams_info():
        yield info


async def test_a_desired_state_flows_from_the_listener_to_the_runner_set_with_their_permissions(
    auth_server: NatsServer, passwords: dict[str, str]
) -> None:
    got: list[object] = []
    done = anyio.Event()

    async def on_desired(delivery: Any) -> None:
        got.append(delivery.message)
        done.set()

    settings = functools.partial(_settings, auth_server, passwords, request_timeout=5)
    sent = _desired()
    async with Bus.connect(settings("runner-set")) as workers, anyio.create_task_group() as tg:
        await tg.start(functools.partial(workers.consume, subjects.RUNNER_SET_DESIRED, on_desired, instance="rs-0"))
        async with Bus.connect(settings("listener")) as listener:
            await listener.publish(sent)
        with anyio.fail_after(10):
            await done.wait()
        assert await workers.last_message(subjects.desired_subject(ERS.namespace, ERS.name)) == got[0]
        tg.cancel_scope.cancel()
    assert got == [sent]


REFUSED = (BusUnavailable, BusConfigConflict, nats.errors.TimeoutError, nats.js.errors.Error, TimeoutError)


def _forbidden_calls() -> dict[str, tuple[str, Callable[[Bus], Awaitable[object]]]]:
    """A JetStream API call each component makes nowhere, which the server must refuse."""
    other_filter = bus_module.consumer_config(subjects.SCALE_SET_REVISIONS, "x", inactive_threshold=None)
    runner_set_filter = bus_module.consumer_config(subjects.RUNNER_SET_REVISIONS, "steal", inactive_threshold=None)
    desired = bus_module.stream_config(subjects.DESIRED_STREAM, BusSettings())
    jobs = msgspec.structs.replace(BusSettings(), history=1)
    return {
        "runner deletes the jobs stream": ("runner", lambda b: b.js.delete_stream(subjects.JOBS_STREAM.name)),
        "listener creates a consumer on the revisions stream": (
            "listener",
            lambda b: b.js.add_consumer(subjects.REVISIONS_STREAM.name, other_filter),
        ),
        "scale-set creates a consumer with the runner-set's filter": (
            "scale-set",
            lambda b: b.js.add_consumer(subjects.REVISIONS_STREAM.name, runner_set_filter),
        ),
        "runner-set changes the jobs stream": (
            "runner-set",
            lambda b: b.js.update_stream(bus_module.stream_config(subjects.JOBS_STREAM, jobs)),
        ),
        "listener changes the desired stream's limits": (
            "listener",
            lambda b: b.js.update_stream(dataclasses.replace(desired, max_msgs_per_subject=1)),
        ),
        "runner reads a desired state": (
            "runner",
            lambda b: b.js.get_last_msg(subjects.DESIRED_STREAM.name, subjects.desired_subject("ci", "set-1")),
        ),
        "runner-set reads a listener session record": (
            "runner-set",
            lambda b: b.js.stream_info(f"KV_{subjects.SESSIONS_BUCKET}"),
        ),
        "listener purges the desired stream": ("listener", lambda b: b.js.purge_stream(subjects.DESIRED_STREAM.name)),
    }


@pytest.mark.parametrize("case", list(_forbidden_calls()))
async def test_a_jetstream_api_call_outside_a_components_use_is_refused(
    auth_server: NatsServer, passwords: dict[str, str], case: str
) -> None:
    # Everything exists (made by bus-setup) and the runner's durable too, so only permissions refuse.
    async with Bus.connect(_settings(auth_server, passwords, "bus-setup", request_timeout=5)):
        pass
    # ... with something to read: the runner's job durable holding a job event, a desired state.
    async with Bus.connect(_settings(auth_server, passwords, "runner", request_timeout=5)) as runner:
        config = bus_module.consumer_config(subjects.RUNNER_JOBS, "runner-jobs", inactive_threshold=None)
        await runner._ensure_consumer(subjects.JOBS_STREAM.name, config)
    async with Bus.connect(_settings(auth_server, passwords, "listener", request_timeout=5)) as listener:
        await listener.publish(_desired())
        await listener.publish(
            JobStarted(scale_set_id=1, scale_set=ResourceRef("ci", "set"), runner_name="r", runner_id=1, job_id="j")
        )
    component, call = _forbidden_calls()[case]
    async with Bus.connect(_settings(auth_server, passwords, component, request_timeout=5)) as bus:
        bus.js = bus.nc.jetstream(timeout=0.5)  # a refused call gets no answer: short wait
        with pytest.raises(REFUSED):
            await call(bus)
    async with Bus.connect(_settings(auth_server, passwords, "bus-setup", request_timeout=5)) as admin:
        assert {s.config.name async for s in _streams(admin)} >= {s.name for s in subjects.STREAMS}
        desired = await admin.js.stream_info(subjects.DESIRED_STREAM.name)
        assert desired.config.max_msgs_per_subject == BusSettings().history
        assert [c.name for c in await admin.js.consumers_info(subjects.REVISIONS_STREAM.name)] == []


async def test_bus_setup_and_status_work_as_the_bus_setup_user(
    auth_server: NatsServer, passwords: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`runnerscale bus setup` / `status` with the narrowed bus-setup user: every stream and bucket,
    then streams, consumers and lease holders listed."""
    from shared.cli import main

    flags = ["--nats-url", auth_server.url, "--nats-user", "bus-setup", "--nats-password", passwords["bus-setup"]]
    flags += ["--bus-lease-ttl", "2"]
    assert await anyio.to_thread.run_sync(main, ["bus", "setup", *flags]) == 0
    capsys.readouterr()
    settings = functools.partial(_settings, auth_server, passwords, request_timeout=5)
    async with Bus.connect(settings("runner")) as runner:
        await _consume_once(runner, subjects.RUNNER_JOBS, None)
    async with (
        Bus.connect(settings("listener")) as listener,
        LeaderLease.join(listener, subjects.listener_lease_name("ci", "set"), replica_id="l-0") as lease,
    ):
        await lease.wait_leader()
        assert await anyio.to_thread.run_sync(main, ["bus", "status", *flags, "--nats-request-timeout", "5"]) == 0
    rows = [msgspec.json.decode(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["stream"] for r in rows if "messages" in r} == {s.name for s in subjects.STREAMS}
    assert {(r["stream"], r["consumer"]) for r in rows if "consumer" in r} == {("RUNNERSCALE_JOBS", "runner-jobs")}
    assert [r["holder"]["replica"] for r in rows if r.get("bucket") == subjects.LEADERS_BUCKET] == ["l-0"]


def test_generated_passwords_never_read_as_a_command_line_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # token_urlsafe starts 1 in 64 of its outputs with "-": `--nats-password -x…` fails to parse.
    outputs = iter(["-starts-with-a-dash", "--another", "fine-one"])
    monkeypatch.setattr("shared.bus.permissions.secrets.token_urlsafe", lambda n: next(outputs))
    assert perms.generate_passwords(("runner",)) == {"runner": "fine-one"}
