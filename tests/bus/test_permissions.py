"""The authenticated bus (README "Authentication and permissions"): a nats-server configured from
:mod:`shared.bus.permissions`, as the embedded default and the deploy manifests are, refuses a
process without credentials and refuses a component publishing on another's subjects."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from shared.bus import Bus, BusSettings, BusUnavailable, PublishFailed
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


def _settings(server: NatsServer, passwords: dict[str, str], component: str | None) -> BusSettings:
    s = BusSettings(
        nats_urls=(server.url,),
        connect_timeout=1.5,
        reconnect_wait=0.2,
        request_timeout=0.5,
        publish_deadline=1.5,
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


async def test_a_process_without_credentials_is_refused_with_a_bus_error(auth_server, passwords) -> None:
    with pytest.raises(BusUnavailable, match=r"cannot connect to NATS .*: authorization violation"):
        async with Bus.connect(_settings(auth_server, passwords, None)):
            pass


async def test_a_wrong_password_is_refused_without_leaking_it(auth_server, passwords) -> None:
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
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
async def test_a_component_cannot_publish_on_another_components_subject(
    auth_server, passwords, component: str, message: BusMessage
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
    auth_server, passwords, component: str, message: BusMessage
) -> None:
    async with Bus.connect(_settings(auth_server, passwords, component)) as bus:
        ack = await bus.publish(message)
        assert not ack.duplicate
        assert await bus.last_message(subject_for(message)) == message


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
async def test_a_component_cannot_delete_or_purge_the_desired_stream(auth_server, passwords, component: str) -> None:
    """`$JS.API.>` minus what no runtime process does: deleting or purging a stream is refused."""
    import nats.js.errors

    from shared.bus import subjects

    async with Bus.connect(_settings(auth_server, passwords, component)) as bus:
        for call in (bus.js.delete_stream, bus.js.purge_stream):
            with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error, TimeoutError)):
                await call(subjects.DESIRED_STREAM.name)
        assert (await bus.js.stream_info(subjects.DESIRED_STREAM.name)).config.name == subjects.DESIRED_STREAM.name
