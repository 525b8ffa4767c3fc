"""Who may publish and subscribe what on the bus: one table, rendered into every nats-server config.

README "The bus (NATS JetStream)", "Authentication and permissions". Each runnerscale process
connects as its own NATS user (user name = component name, a random password per install) and
may publish only its own subjects:

=============  ==================================================================================
listener       desired states and job events; its session and leader KV keys
runner-set     RevisionApplied; acks of the desired-state and revision consumers
scale-set      RevisionPublished; acks of its revision consumer
runner         acks of the job consumer
listener-pod   acks of its change consumer, plus everything the listener may do (it writes its
               own credentials into each listener's config, README "listener-pod worker")
bus-setup      the JetStream API only (creates/checks streams and buckets)
observer       subscribes to desired states only (the demo's "desired=" line)
=============  ==================================================================================

Every worker also writes the shard/member/leader lease buckets (``--ownership nats``). Every
process may call the JetStream API (``$JS.API.>``: each one creates or checks the streams and
buckets it uses at start-up, and pull consumers, KV reads and last-message reads are API
requests) and receive replies on ``_INBOX.>``.

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

__all__ = [
    "COMPONENTS",
    "Permissions",
    "auth_secret",
    "authorization",
    "generate_passwords",
    "password_env_var",
    "permissions_for",
    "render_authorization",
    "write_local_credentials",
]

P = subjects.PREFIX
JS_API = "$JS.API.>"
INBOX = "_INBOX.>"


def _ack(stream: subjects.StreamSpec) -> str:
    return f"$JS.ACK.{stream.name}.>"


def _kv(bucket: str) -> str:
    return f"$KV.{bucket}.>"


class Permissions(msgspec.Struct, frozen=True):
    """Subjects a NATS user may publish to and subscribe to (``allow`` lists; all else is denied).

    ``publish_deny`` carves JetStream API calls no runtime process makes out of ``$JS.API.>``
    (deny wins over allow in nats-server).
    """

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()


_LEASES = (_kv(subjects.SHARDS_BUCKET), _kv(subjects.MEMBERS_BUCKET), _kv(subjects.LEADERS_BUCKET))
_LISTENER_PUBLISH = (
    f"{P}.desired.>",
    f"{P}.jobs.>",
    _kv(subjects.SESSIONS_BUCKET),
    _kv(subjects.LEADERS_BUCKET),
)

#: The one table: component (= NATS user name) -> what it may publish beyond the JetStream API.
_PUBLISH: dict[str, tuple[str, ...]] = {
    "listener": _LISTENER_PUBLISH,
    "runner-set": (
        f"{P}.revisions.*.*.applied",
        _ack(subjects.DESIRED_STREAM),
        _ack(subjects.REVISIONS_STREAM),
        *_LEASES,
    ),
    "scale-set": (f"{P}.revisions.*.*.published", _ack(subjects.REVISIONS_STREAM), *_LEASES),
    "runner": (_ack(subjects.JOBS_STREAM), *_LEASES),
    "listener-pod": (_ack(subjects.CHANGES_STREAM), *_LEASES, *_LISTENER_PUBLISH),
    "bus-setup": (),
    "observer": (),
}
_SUBSCRIBE: dict[str, tuple[str, ...]] = {"observer": (f"{P}.desired.>",)}

# Nothing at run time deletes a stream, a consumer or a stored message, or purges a stream other
# than the members bucket (a replica's own member key on shutdown, shared/bus/leases.py).
_STREAM_NAMES = (*(s.name for s in subjects.STREAMS), *(f"KV_{b}" for b in subjects.BUCKETS))
_RUNTIME_DENY = (
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.CONSUMER.DELETE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    *(f"$JS.API.STREAM.PURGE.{name}" for name in _STREAM_NAMES if name != f"KV_{subjects.MEMBERS_BUCKET}"),
)
_LISTENER_DENY = (*_RUNTIME_DENY, f"$JS.API.STREAM.PURGE.KV_{subjects.MEMBERS_BUCKET}")
_DENY: dict[str, tuple[str, ...]] = {
    "listener": _LISTENER_DENY,
    "runner-set": _RUNTIME_DENY,
    "scale-set": _RUNTIME_DENY,
    "runner": _RUNTIME_DENY,
    "listener-pod": _RUNTIME_DENY,
}

COMPONENTS: tuple[str, ...] = tuple(_PUBLISH)


def _dedupe(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def permissions_for(component: str) -> Permissions:
    """The permissions of one component's NATS user; KeyError for an unknown component."""
    own = _PUBLISH[component]
    if component == "observer":
        return Permissions(publish=(), subscribe=_dedupe((*_SUBSCRIBE[component], INBOX)))
    return Permissions(
        publish=_dedupe((JS_API, *own)),
        subscribe=_dedupe((*_SUBSCRIBE.get(component, ()), INBOX)),
        publish_deny=_DENY.get(component, ()),
    )


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
        if perms.publish_deny:
            publish["deny"] = list(perms.publish_deny)
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
    """A fresh random password per component (the embedded default, at every start)."""
    return {c: secrets.token_urlsafe(24) for c in components}


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
