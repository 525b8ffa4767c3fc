"""Who may publish and subscribe what on the bus: one table, rendered into every nats-server config.

README "The bus (NATS JetStream)", "Authentication and permissions". Each runnerscale process
connects as its own NATS user (user name = component name, a random password per install) and
may publish only its own subjects and only the JetStream API calls on the streams, consumers and
KV buckets it uses (:data:`USES`):

=============  ==================================================================================
listener       desired states and job events; its session and leader KV keys
runner-set     RevisionApplied; acks of the desired-state, revision and job-completion consumers; member records
scale-set      RevisionPublished; acks of its revision consumer; member records
runner         acks of the job consumer; member records
listener-pod   acks of its change consumer; member records (listener pods get the ``listener``
               user's credentials, README "listener-pod worker")
bus-setup      creates/checks/reads every stream and bucket (``runnerscale bus setup``/``status``)
observer       subscribes to desired states only (the demo's "desired=" line)
=============  ==================================================================================

Every user but ``observer`` receives replies on ``_INBOX.>``. Nothing at run time deletes or
purges a stream, a consumer or a stored message, so no user may.

The embedded default (``runnerscale demo``) writes this table with generated passwords into its
nats-server config; ``deploy/nats`` and the Helm chart carry the same table with passwords from a
Secret; tests/deploy checks that they match :func:`authorization`.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

import msgspec

from shared.bus import subjects
from shared.bus.subjects import ConsumerSpec, StreamSpec

__all__ = [
    "COMPONENTS",
    "USES",
    "Permissions",
    "Uses",
    "auth_secret",
    "authorization",
    "generate_passwords",
    "password_env_var",
    "permissions_for",
    "render_authorization",
    "uses_of",
    "write_local_credentials",
]

P = subjects.PREFIX
API = "$JS.API"
INBOX = "_INBOX.>"


class Uses(msgspec.Struct, frozen=True, kw_only=True):
    """What one component touches on JetStream; its permissions are derived from this.

    ``streams`` and ``buckets`` are what ``Bus.connect`` creates or checks at start-up for this
    component (``tune``: it may also update an existing stream's limits; ``checks``: streams it
    creates or checks but never tunes, another component's); ``consumers`` the
    durable pull consumers it creates and pulls from (and acks); ``reads`` the streams whose
    last message per subject it reads (``Bus.last_message``), bucket keys included; ``publish``
    its own subjects, the keys it writes included.
    """

    publish: tuple[str, ...] = ()
    streams: tuple[StreamSpec, ...] = ()
    tune: bool = True
    checks: tuple[StreamSpec, ...] = ()
    consumers: tuple[ConsumerSpec, ...] = ()
    reads: tuple[StreamSpec, ...] = ()
    buckets: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()


def _kv(bucket: str) -> str:
    """Writing keys of ``bucket`` (puts, creates, updates, deletes are publishes)."""
    return f"$KV.{bucket}.>"


_WORKER_BUCKETS = (subjects.MEMBERS_BUCKET,)  # shard ownership on NATS (``--ownership nats``)
_ALL_BUCKETS = subjects.BUCKETS

#: The one table: component (= NATS user name) -> what it uses.
USES: dict[str, Uses] = {
    "listener": Uses(
        publish=(f"{P}.desired.>", f"{P}.jobs.>", _kv(subjects.LEADERS_BUCKET), _kv(subjects.SESSIONS_BUCKET)),
        streams=(subjects.DESIRED_STREAM, subjects.JOBS_STREAM),
        tune=False,  # Bus.connect(tune_existing=False): its config carries no stream sizing
        buckets=(subjects.LEADERS_BUCKET, subjects.SESSIONS_BUCKET),
    ),
    "runner-set": Uses(
        publish=(f"{P}.revisions.*.*.applied", _kv(subjects.MEMBERS_BUCKET)),
        streams=(subjects.DESIRED_STREAM, subjects.REVISIONS_STREAM),
        checks=(subjects.JOBS_STREAM,),  # for its job-completion consumer; the listener's and runner's stream
        consumers=(subjects.RUNNER_SET_DESIRED, subjects.RUNNER_SET_REVISIONS, subjects.RUNNER_SET_COMPLETIONS),
        reads=(subjects.DESIRED_STREAM,),
        buckets=_WORKER_BUCKETS,
    ),
    "scale-set": Uses(
        publish=(f"{P}.revisions.*.*.published", _kv(subjects.MEMBERS_BUCKET)),
        streams=(subjects.REVISIONS_STREAM,),
        consumers=(subjects.SCALE_SET_REVISIONS,),
        buckets=_WORKER_BUCKETS,
    ),
    "runner": Uses(
        publish=(_kv(subjects.MEMBERS_BUCKET),),
        streams=(subjects.JOBS_STREAM,),
        consumers=(subjects.RUNNER_JOBS,),
        buckets=_WORKER_BUCKETS,
    ),
    "listener-pod": Uses(
        publish=(_kv(subjects.MEMBERS_BUCKET),),
        streams=(subjects.CHANGES_STREAM,),
        consumers=(subjects.LISTENER_POD_CHANGES,),
        buckets=_WORKER_BUCKETS,
    ),
    "bus-setup": Uses(streams=subjects.STREAMS, reads=subjects.STREAMS, buckets=_ALL_BUCKETS),
    "observer": Uses(subscribe=(f"{P}.desired.>",)),
}

COMPONENTS: tuple[str, ...] = tuple(USES)


def uses_of(user: str) -> Uses | None:
    """What the component named ``user`` uses; None for a user outside the table (or no user)."""
    return USES.get(user)


class Permissions(msgspec.Struct, frozen=True):
    """Subjects a NATS user may publish to and subscribe to (``allow`` lists; all else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def _stream_api(stream: str, *, tune: bool) -> tuple[str, ...]:
    calls = [f"{API}.STREAM.INFO.{stream}", f"{API}.STREAM.CREATE.{stream}"]
    if tune:
        calls.append(f"{API}.STREAM.UPDATE.{stream}")
    return tuple(calls)


def _read_api(stream: str) -> tuple[str, ...]:
    # Last message per subject: STREAM.MSG.GET, or DIRECT.GET (KV gets on buckets allowing it).
    return (f"{API}.STREAM.MSG.GET.{stream}", f"{API}.DIRECT.GET.{stream}", f"{API}.DIRECT.GET.{stream}.>")


def _consumer_api(consumer: ConsumerSpec) -> tuple[str, ...]:
    # A consumer is named `<durable>` or `<durable>-<replica>` (one subject token; NATS wildcards
    # match whole tokens), so any name on its stream; a single filter is part of the create
    # subject, which pins the filter: a component cannot create a consumer reading another's.
    s = consumer.stream
    if len(consumer.filter_subjects) == 1:
        create = f"{API}.CONSUMER.CREATE.{s}.*.{consumer.filter_subjects[0]}"
    else:
        create = f"{API}.CONSUMER.CREATE.{s}.*"
    return (f"{API}.CONSUMER.INFO.{s}.*", create, f"{API}.CONSUMER.MSG.NEXT.{s}.*", f"$JS.ACK.{s}.>")


def _bus_status_api() -> tuple[str, ...]:
    # `runnerscale bus status` and inspection: stream and consumer listings, and the keys of each
    # bucket (an ephemeral ordered consumer on the bucket's stream).
    return (
        f"{API}.STREAM.NAMES",
        f"{API}.STREAM.LIST",
        *(f"{API}.CONSUMER.LIST.{s.name}" for s in subjects.STREAMS),
        *(f"{API}.CONSUMER.CREATE.KV_{b}.>" for b in subjects.BUCKETS),
        *(f"{API}.CONSUMER.CREATE.KV_{b}" for b in subjects.BUCKETS),
        *(f"{API}.CONSUMER.INFO.KV_{b}.*" for b in subjects.BUCKETS),
        *(f"$JS.FC.KV_{b}.>" for b in subjects.BUCKETS),  # the ordered consumer's flow control
    )


def _dedupe(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def permissions_for(component: str) -> Permissions:
    """The permissions of one component's NATS user; KeyError for an unknown component."""
    uses = USES[component]
    publish: list[str] = list(uses.publish)
    for stream in uses.streams:
        publish += _stream_api(stream.name, tune=uses.tune)
    for stream in uses.checks:
        publish += _stream_api(stream.name, tune=False)
    for consumer in uses.consumers:
        publish += _consumer_api(consumer)
    for stream in uses.reads:
        publish += _read_api(stream.name)
    for bucket in uses.buckets:
        publish += [*_stream_api(f"KV_{bucket}", tune=False), *_read_api(f"KV_{bucket}")]
    if component == "bus-setup":
        publish += _bus_status_api()
    return Permissions(publish=_dedupe(tuple(publish)), subscribe=_dedupe((*uses.subscribe, INBOX)))


def password_env_var(component: str) -> str:
    """The environment variable a deployed nats-server reads a component's password from."""
    return "NATS_PASSWORD_" + component.upper().replace("-", "_")


def authorization(passwords: Mapping[str, str]) -> dict[str, list[dict[str, object]]]:
    """The nats-server ``authorization`` block: one user per component in ``passwords``.

    A password starting with ``$`` is written bare (a nats-server variable such as
    ``$NATS_PASSWORD_LISTENER``, resolved from the server's environment).
    """
    users: list[dict[str, object]] = []
    for component in COMPONENTS:
        if component not in passwords:
            continue
        perms = permissions_for(component)
        publish: dict[str, list[str]] = {"allow": list(perms.publish)} if perms.publish else {"deny": [">"]}
        users.append(
            {
                "user": component,
                "password": passwords[component],
                "permissions": {"publish": publish, "subscribe": {"allow": list(perms.subscribe)}},
            }
        )
    return {"users": users}


def _value(v: object, key: str = "") -> str:
    if isinstance(v, str):  # a "$VAR" password is left bare for nats-server to resolve
        return v if key == "password" and v.startswith("$") else msgspec.json.encode(v).decode()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x, k)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def render_authorization(passwords: Mapping[str, str], indent: str = "") -> str:
    """:func:`authorization` as nats-server configuration text (one user per line)."""
    lines = [f"{indent}authorization {{", f"{indent}  users: ["]
    lines += [f"{indent}    {_value(user)}" for user in authorization(passwords)["users"]]
    lines += [f"{indent}  ]", f"{indent}}}"]
    return "\n".join(lines) + "\n"


def generate_passwords(components: tuple[str, ...] = COMPONENTS) -> dict[str, str]:
    """A fresh random password per component (the embedded default, at every start). None starts
    with "-": passed as ``--nats-password <value>`` it would read as an option (1 in 64 of
    ``token_urlsafe``'s outputs did)."""
    return {c: _password() for c in components}


def _password() -> str:
    while True:
        value = secrets.token_urlsafe(24)
        if not value.startswith("-"):
            return value


def auth_secret(
    namespace: str, name: str = "runnerscale-nats-auth", passwords: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The Secret of the plain manifests (deploy/nats): one key per component holding its password.

    ``runnerscale bus secret | kubectl apply -f -`` creates it (README "Deploying to a cluster").
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "nats", "app.kubernetes.io/part-of": "runnerscale"},
        },
        "type": "Opaque",
        "stringData": dict(passwords if passwords is not None else generate_passwords()),
    }


def write_local_credentials(directory: Path) -> dict[str, str]:
    """The Procfile's credentials: ``nats-auth.conf`` (the table, for ``nats-server -c``) and one
    ``nats-<component>.password`` file per component (mode 0600) in ``directory``.

    Passwords already written there are kept, so a restart of some processes keeps working.
    """
    directory.mkdir(parents=True, exist_ok=True)
    passwords: dict[str, str] = {}
    for component, fresh in generate_passwords().items():
        path = directory / f"nats-{component}.password"
        if path.is_file() and path.read_text().strip():
            passwords[component] = path.read_text().strip()
            continue
        path.touch(mode=0o600)
        path.write_text(fresh + "\n")
        passwords[component] = fresh
    conf = directory / "nats-auth.conf"
    conf.touch(mode=0o600)
    conf.write_text(render_authorization(passwords))
    return passwords
