"""What an AutoscalingListener should own, built from it (pure functions): the service account,
role, role binding, listener config Secret and listener pod.

Object layout (ARC ``resourcebuilder.go``):

| object | name | namespace | owner |
|---|---|---|---|
| ServiceAccount | ``<AL>`` | AL namespace | AL |
| Role, RoleBinding | ``<AL>`` | ARS namespace | none (cross-namespace): cleaned up explicitly |
| config Secret | ``<AL>-config`` | AL namespace | AL |
| listener Pod | ``<AL>`` | AL namespace | AL |
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import msgspec

from services.listener_pod.decide import ListenerPodSettings, addr_port, enabled_addr
from shared.api import AutoscalingListener
from shared.api.constants import (
    ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION,
    API_VERSION,
    COMPONENT_LISTENER,
    KIND_AUTOSCALING_LISTENER,
    LABEL_COMPONENT,
    LABEL_LISTENER_NAME,
    LABEL_LISTENER_NAMESPACE,
    LABEL_OS,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
    LISTENER_CONTAINER_NAME,
)
from shared.api.names import filter_and_merge_labels, filter_labels
from shared.bus import BusSettings
from shared.settings import InvalidSetting

Json = dict[str, Any]

#: Where the config Secret is mounted in the listener container, and the file the listener reads.
CONFIG_MOUNT_PATH = "/etc/gha-listener"
CONFIG_FILE_KEY = "config.json"
CONFIG_PATH = f"{CONFIG_MOUNT_PATH}/{CONFIG_FILE_KEY}"
CONFIG_VOLUME_NAME = "listener-config"
#: Annotation that makes the node simulator (services/embedded/node_sim) run the pod as a real subprocess.
ANNOTATION_NODE_SIM_EXEC = "runnerscale.dev/node-sim-exec"
DEFAULT_TERMINATION_GRACE_SECONDS = 60


# --- names -----------------------------------------------------------------------------------------


def service_account_name(al: AutoscalingListener) -> str:
    return al.metadata.name


def role_name(al: AutoscalingListener) -> str:
    return al.metadata.name


def config_secret_name(al: AutoscalingListener) -> str:
    return f"{al.metadata.name}-config"


def proxy_secret_name(al: AutoscalingListener) -> str:
    """ARC's separate proxy Secret. runnerscale puts the proxy into the config Secret instead; the
    name is only used to clean up a Secret left by Go ARC."""
    return f"{al.metadata.name}-proxy"


def pod_name(al: AutoscalingListener) -> str:
    return al.metadata.name


def ars_namespace(al: AutoscalingListener) -> str:
    return al.spec.autoscaling_runner_set_namespace


# --- labels / annotations ---------------------------------------------------------------------------


def owner_reference(al: AutoscalingListener) -> Json:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_AUTOSCALING_LISTENER,
        "name": al.metadata.name,
        "uid": al.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _scale_set_labels(al: AutoscalingListener) -> dict[str, str]:
    return {
        LABEL_SCALE_SET_NAME: al.spec.autoscaling_runner_set_name,
        LABEL_SCALE_SET_NAMESPACE: al.spec.autoscaling_runner_set_namespace,
    }


# --- ServiceAccount, Role, RoleBinding -------------------------------------------------------------


def desired_service_account(al: AutoscalingListener, settings: ListenerPodSettings) -> Json:
    meta = al.spec.service_account_metadata
    labels = filter_and_merge_labels(
        meta.labels if meta else None, {**al.metadata.labels, **_scale_set_labels(al)}, settings.exclude_label_prefixes
    )
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": service_account_name(al),
            "namespace": al.metadata.namespace,
            "labels": labels,
            "annotations": dict(meta.annotations) if meta else {},
            "ownerReferences": [owner_reference(al)],
        },
    }


def role_rules(ers_name: str) -> list[Json]:
    """The listener's Role grants nothing: the runnerscale listener never talks to Kubernetes (it
    publishes desired states on NATS; the runner-set worker writes the ERS). ARC's
    ``rulesForListenerRole`` granted patch on the ERS ``ers_name`` and on every runner; the Role and
    its binding are kept (empty) so ARC's object names and cleanup stay as they were."""
    return []


def _role_labels(
    al: AutoscalingListener, meta_labels: Mapping[str, str] | None, settings: ListenerPodSettings
) -> dict[str, str]:
    ours = {
        **al.metadata.labels,
        **_scale_set_labels(al),
        LABEL_LISTENER_NAMESPACE: al.metadata.namespace,
        LABEL_LISTENER_NAME: al.metadata.name,
    }
    return filter_and_merge_labels(meta_labels, ours, settings.exclude_label_prefixes)


def desired_role(al: AutoscalingListener, settings: ListenerPodSettings) -> Json:
    meta = al.spec.role_metadata
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": role_name(al),
            "namespace": ars_namespace(al),
            "labels": _role_labels(al, meta.labels if meta else None, settings),
            "annotations": dict(meta.annotations) if meta else {},
        },
        "rules": role_rules(al.spec.ephemeral_runner_set_name),
    }


def desired_role_binding(al: AutoscalingListener, settings: ListenerPodSettings) -> Json:
    meta = al.spec.role_binding_metadata
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": role_name(al),
            "namespace": ars_namespace(al),
            "labels": _role_labels(al, meta.labels if meta else None, settings),
            "annotations": dict(meta.annotations) if meta else {},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name(al)},
        "subjects": [{"kind": "ServiceAccount", "name": service_account_name(al), "namespace": al.metadata.namespace}],
    }


# --- the listener config -----------------------------------------------------------------------------


class ConfigProblem(ValueError):
    """The listener config cannot be built (bad credentials, missing CA key, unsupported vault).

    The message never contains a secret value; it names the object and field at fault."""


@dataclass(frozen=True)
class Credentials:
    """GitHub credentials read from the ARS namespace's ``githubConfigSecret``."""

    github_token: str = ""
    github_app_id: str = ""
    github_app_installation_id: int = 0
    github_app_private_key: str = ""

    def __repr__(self) -> str:  # never print the secret material
        kind = "token" if self.github_token else "app"
        return f"Credentials({kind}, app_id={self.github_app_id!r}, installation_id={self.github_app_installation_id})"


@dataclass(frozen=True)
class BusPassThrough:
    """The worker's own NATS settings, passed through to the listener config (``nats``/``ha``)."""

    servers: tuple[str, ...] = ()
    credentials_file: str = ""
    user: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    tls_ca: str = ""
    request_timeout_seconds: float | None = None
    publish_deadline_seconds: float | None = None
    lease_ttl_seconds: float | None = None
    renew_interval_seconds: float | None = None

    @classmethod
    def from_bus_settings(cls, s: BusSettings) -> BusPassThrough:
        """From this worker's own bus settings."""
        return cls(
            servers=tuple(s.nats_urls),
            credentials_file=s.creds_file,
            user=s.user,
            password=s.effective_password,
            token=s.token,
            tls_ca=s.tls_ca,
            request_timeout_seconds=s.request_timeout,
            publish_deadline_seconds=s.publish_deadline,
            lease_ttl_seconds=s.lease_ttl,
            renew_interval_seconds=s.renew_interval or None,
        )


def read_password_file(path: str) -> str:
    """The password in ``path`` (trailing newline dropped); InvalidSetting if unreadable or empty."""
    try:
        password = Path(path).read_text().strip()
    except OSError as exc:
        raise InvalidSetting("nats_password_file", f"cannot read {path}: {type(exc).__name__}") from None
    if not password:
        raise InvalidSetting("nats_password_file", f"{path} is empty")
    return password


def listener_bus(own: BusPassThrough, settings: ListenerPodSettings) -> BusPassThrough:
    """What listener configs carry: this worker's NATS settings, ``--listener-nats-url`` in place of
    its URLs, and the listener's own user in place of its credentials when ``--listener-nats-user``
    is set (README "Authentication and permissions": the listener-pod worker's user may not
    publish what a listener publishes)."""
    bus = own
    if settings.nats_urls:
        bus = replace(bus, servers=settings.nats_urls)
    if settings.nats_user:
        password = read_password_file(settings.nats_password_file)
        bus = replace(bus, user=settings.nats_user, password=password, credentials_file="", token="")
    return bus


def proxy_url_with_credentials(url: str, username: str, password: str) -> str:
    """``http://host:port`` + credentials → ``http://user:pass@host:port`` (ARC ``ToSecretData``)."""
    if not url or not username:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    userinfo = quote(username, safe="") + (":" + quote(password, safe="") if password else "")
    return urlunsplit((parts.scheme, f"{userinfo}@{host}", parts.path, parts.query, parts.fragment))


def proxy_settings(al: AutoscalingListener, proxy_credentials: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The config's ``proxy`` block: URLs with credentials from ``credentialSecretRef`` secrets
    (``proxy_credentials`` maps secret name → (username, password)), ``no_proxy`` comma-joined."""
    p = al.spec.proxy
    if p is None:
        return {}
    out: dict[str, str] = {}
    for key, server in (("http_proxy", p.http), ("https_proxy", p.https)):
        if server is not None and server.url:
            user, password = (
                proxy_credentials.get(server.credential_secret_ref, ("", ""))
                if server.credential_secret_ref
                else ("", "")
            )
            out[key] = proxy_url_with_credentials(server.url, user, password)
    if p.no_proxy:
        out["no_proxy"] = ",".join(p.no_proxy)
    return out


def proxy_secret_refs(al: AutoscalingListener) -> list[str]:
    """Names of the proxy credential Secrets (in the ARS namespace) the config needs."""
    p = al.spec.proxy
    if p is None:
        return []
    names = [s.credential_secret_ref for s in (p.http, p.https) if s is not None and s.credential_secret_ref]
    return sorted(set(names))


def listener_config(
    al: AutoscalingListener,
    credentials: Credentials,
    settings: ListenerPodSettings,
    bus: BusPassThrough,
    *,
    server_root_ca: str = "",
    proxy: Mapping[str, str] | None = None,
) -> Json:
    """The listener's ``config.json`` as a JSON tree, in the format ``shared.listener_config``
    parses. Deterministic: the same inputs give the same tree (so it is only rewritten on change)."""
    spec = al.spec
    if spec.vault_config is not None and spec.vault_config.type:
        raise ConfigProblem(
            "spec.vaultConfig: vault-backed credentials are not supported by runnerscale; use a Kubernetes Secret"
        )
    cfg: Json = {
        "configure_url": spec.github_config_url,
        "runner_scale_set_id": spec.runner_scale_set_id,
        "runner_scale_set_name": spec.autoscaling_runner_set_name,
        "ephemeral_runner_set_namespace": spec.autoscaling_runner_set_namespace,
        "ephemeral_runner_set_name": spec.ephemeral_runner_set_name,
        "min_runners": spec.min_runners,
        "max_runners": spec.max_runners,
    }
    if credentials.github_token:
        cfg["github_token"] = credentials.github_token
    else:
        cfg["github_app_id"] = credentials.github_app_id
        cfg["github_app_installation_id"] = credentials.github_app_installation_id
        cfg["github_app_private_key"] = credentials.github_app_private_key
    if server_root_ca:
        cfg["server_root_ca"] = server_root_ca
    if proxy:
        cfg["proxy"] = dict(proxy)
    nats: Json = {}
    if bus.servers:
        nats["servers"] = list(bus.servers)
    for key, value in (
        ("credentials_file", bus.credentials_file),
        ("user", bus.user),
        ("password", bus.password),
        ("token", bus.token),
        ("tls_ca", bus.tls_ca),
        ("request_timeout_seconds", bus.request_timeout_seconds),
        ("publish_deadline_seconds", bus.publish_deadline_seconds),
    ):
        if value:
            nats[key] = value
    if nats:
        cfg["nats"] = nats
    ha: Json = {}
    if bus.lease_ttl_seconds:
        ha["lease_ttl_seconds"] = bus.lease_ttl_seconds
    if bus.renew_interval_seconds:
        ha["renew_interval_seconds"] = bus.renew_interval_seconds
    if ha:
        cfg["ha"] = ha
    metrics_addr = enabled_addr(settings.metrics_addr)
    cfg["metrics_addr"] = metrics_addr
    if metrics_addr:
        cfg["metrics_endpoint"] = settings.metrics_endpoint or "/metrics"
    cfg["health_addr"] = enabled_addr(settings.health_addr)
    cfg["log_level"] = settings.log_level
    return cfg


def encode_config(cfg: Json) -> bytes:
    """Canonical bytes of the config (sorted keys), so equal configs give equal Secret data."""
    return json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()


def desired_config_secret(al: AutoscalingListener, config_bytes: bytes, settings: ListenerPodSettings) -> Json:
    meta = al.spec.config_secret_metadata
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": config_secret_name(al),
            "namespace": al.metadata.namespace,
            "labels": filter_labels(meta.labels if meta else None, settings.exclude_label_prefixes),
            "annotations": dict(meta.annotations) if meta else {},
            "ownerReferences": [owner_reference(al)],
        },
        "data": {CONFIG_FILE_KEY: base64.b64encode(config_bytes).decode()},
    }


# --- the listener pod --------------------------------------------------------------------------------


def _probe(path: str, port: int, period: int, failure_threshold: int) -> Json:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failure_threshold,
    }


def base_listener_pod(al: AutoscalingListener, settings: ListenerPodSettings, config_resource_version: str) -> Json:
    """The pod before the listener template is merged in (ARC ``newScaleSetListenerPod``)."""
    env: list[Json] = [
        {"name": "LISTENER_CONFIG_PATH", "value": CONFIG_PATH},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    container: Json = {
        "name": LISTENER_CONTAINER_NAME,
        "image": al.spec.image or settings.image,
        "command": [*settings.command, "--config", CONFIG_PATH],
        "env": env,
        "volumeMounts": [{"name": CONFIG_VOLUME_NAME, "mountPath": CONFIG_MOUNT_PATH, "readOnly": True}],
    }
    ports: list[Json] = []
    metrics_port = addr_port(settings.metrics_addr)
    if metrics_port:
        ports.append({"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"})
    health_port = addr_port(settings.health_addr)
    if health_port:
        if health_port != metrics_port:
            ports.append({"name": "health", "containerPort": health_port, "protocol": "TCP"})
        container["livenessProbe"] = _probe(
            "/healthz", health_port, settings.probe_period_seconds, settings.liveness_failure_threshold
        )
        container["readinessProbe"] = _probe(
            "/readyz", health_port, settings.probe_period_seconds, settings.readiness_failure_threshold
        )
    if ports:
        container["ports"] = ports
    annotations: dict[str, str] = {}
    if config_resource_version:
        annotations[ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION] = config_resource_version
    if settings.node_sim_exec:
        annotations[ANNOTATION_NODE_SIM_EXEC] = "true"
    spec: Json = {
        "serviceAccountName": service_account_name(al),
        "nodeSelector": {LABEL_OS: "linux"},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": DEFAULT_TERMINATION_GRACE_SECONDS,
        "containers": [container],
        "volumes": [{"name": CONFIG_VOLUME_NAME, "secret": {"secretName": config_secret_name(al)}}],
    }
    if al.spec.image_pull_secrets:
        spec["imagePullSecrets"] = [msgspec.to_builtins(r) for r in al.spec.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(al),
            "namespace": al.metadata.namespace,
            "labels": {
                **al.metadata.labels,
                LABEL_COMPONENT: COMPONENT_LISTENER,
            },  # the worker's pod informer selects on it
            "annotations": annotations,
            "ownerReferences": [owner_reference(al)],
        },
        "spec": spec,
    }


# Container fields the template's `listener` container replaces when it sets them.
_CONTAINER_OVERWRITE = (
    "workingDir",
    "imagePullPolicy",
    "resources",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "securityContext",
    "resizePolicy",
    "restartPolicy",
    "stdin",
    "stdinOnce",
    "tty",
)
_CONTAINER_APPEND = ("env", "args", "ports", "envFrom", "volumeMounts", "volumeDevices")
# Pod fields the template cannot change (the worker owns the service account and the config volume name).
_POD_IGNORED = ("serviceAccountName", "serviceAccount", "automountServiceAccountToken", "containers", "volumes")


def merge_listener_template(pod: Json, template: Mapping[str, Any] | None) -> Json:
    """ARC's ``mergeListenerPodWithTemplate``, with one deliberate difference: a field the template
    does not set never clears what the worker set (ARC overwrites e.g. probes and
    terminationGracePeriodSeconds with the template's, nil included).

    - template labels/annotations are added where the key is absent;
    - the template container named ``listener`` is merged into ours: image/command if non-empty;
      env, args, ports, envFrom, volumeMounts, volumeDevices appended; the fields of
      ``_CONTAINER_OVERWRITE`` replaced when set; other template containers become sidecars;
    - pod level: volumes appended; ``nodeSelector`` and ``imagePullSecrets`` replaced when present
      (an explicit ``{}`` clears the linux default); every other spec field the template sets
      replaces ours; service-account fields are ignored.
    """
    if not template:
        return pod
    out = copy.deepcopy(pod)
    tmeta = template.get("metadata") or {}
    meta = out["metadata"]
    for key in ("labels", "annotations"):
        extra = tmeta.get(key) or {}
        if isinstance(extra, Mapping):
            merged = dict(meta.get(key) or {})
            for k, v in extra.items():
                merged.setdefault(str(k), str(v))
            meta[key] = merged
    tspec = template.get("spec") or {}
    if not isinstance(tspec, Mapping):
        return out
    spec = out["spec"]
    base = spec["containers"][0]
    sidecars: list[Json] = []
    for c in tspec.get("containers") or []:
        if not isinstance(c, Mapping):
            continue
        if c.get("name") != LISTENER_CONTAINER_NAME:
            sidecars.append(copy.deepcopy(dict(c)))
            continue
        if c.get("image"):
            base["image"] = c["image"]
        if c.get("command"):
            base["command"] = list(c["command"])
        for key in _CONTAINER_APPEND:
            if c.get(key):
                base[key] = [*(base.get(key) or []), *copy.deepcopy(list(c[key]))]
        for key in _CONTAINER_OVERWRITE:
            if key in c and c[key] is not None:
                base[key] = copy.deepcopy(c[key])
    spec["containers"] = [base, *sidecars]
    if tspec.get("volumes"):
        spec["volumes"] = [*spec["volumes"], *copy.deepcopy(list(tspec["volumes"]))]
    for key, value in tspec.items():
        if key in _POD_IGNORED or key == "volumes":
            continue
        if key == "restartPolicy" and not value:
            continue
        if value is None:
            continue
        spec[key] = copy.deepcopy(value)
    return out


def desired_listener_pod(al: AutoscalingListener, settings: ListenerPodSettings, config_resource_version: str) -> Json:
    """The listener pod: the base pod with the AL's listener template merged in. It carries the
    config Secret's resourceVersion so that a config-only change restarts the listener."""
    return merge_listener_template(base_listener_pod(al, settings, config_resource_version), al.spec.template)
