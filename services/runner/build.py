"""Pure builders of the objects an EphemeralRunner owns: the JIT config Secret and the runner pod
(as ARC's resource builder makes them). No I/O; every function returns a JSON tree ready to POST.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from collections.abc import Iterable
from typing import Any

import msgspec

from shared.api import EphemeralRunner
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    API_VERSION,
    ENV_RUNNER_EXTRA_USER_AGENT,
    ENV_RUNNER_JIT_CONFIG,
    ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE,
    KIND_EPHEMERAL_RUNNER,
    LABEL_EPHEMERAL_RUNNER,
    LABEL_POD_TEMPLATE_HASH,
    RUNNER_CONTAINER_NAME,
)
from shared.api.names import filter_labels

JsonTree = dict[str, Any]

# Keys of the JIT config Secret (ARC's).
SECRET_KEY_JIT_TOKEN = "jitToken"
SECRET_KEY_RUNNER_NAME = "runnerName"
SECRET_KEY_RUNNER_ID = "runnerId"
SECRET_KEY_SCALE_SET_ID = "scaleSetId"

PROXY_ENV_KEYS = ("http_proxy", "https_proxy", "no_proxy")


class PodBuildError(ValueError):
    """The ER's pod template cannot yield a runner pod (e.g. no container named ``runner``)."""


def owner_reference(er: EphemeralRunner) -> JsonTree:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_EPHEMERAL_RUNNER,
        "name": er.metadata.name,
        "uid": er.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def build_jit_secret(
    er: EphemeralRunner,
    *,
    runner_id: int,
    runner_name: str,
    encoded_jit_config: str,
    exclude_label_prefixes: Iterable[str] = (),
) -> JsonTree:
    """The Secret ``<ER name>`` holding the JIT config, owned by the ER."""
    meta = er.spec.ephemeral_runner_config_secret_metadata
    metadata: JsonTree = {
        "name": er.metadata.name,
        "namespace": er.metadata.namespace,
        "ownerReferences": [owner_reference(er)],
    }
    labels = filter_labels(meta.labels if meta else None, exclude_label_prefixes)
    if labels:
        metadata["labels"] = labels
    if meta and meta.annotations:
        metadata["annotations"] = dict(meta.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {
            SECRET_KEY_JIT_TOKEN: _b64(encoded_jit_config),
            SECRET_KEY_RUNNER_NAME: _b64(runner_name),
            SECRET_KEY_RUNNER_ID: _b64(str(runner_id)),
            SECRET_KEY_SCALE_SET_ID: _b64(str(er.spec.runner_scale_set_id)),
        },
    }


def parse_runner_id(raw: bytes | None) -> int | None:
    """The runner id stored in the Secret (decoded bytes), or None when absent or unparsable."""
    if raw is None:
        return None
    try:
        value = int(raw.decode().strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value > 0 else None


def pod_template_hash(er: EphemeralRunner) -> str:
    """A stable, label-safe digest of the runner spec (only a label: nothing compares it)."""
    canonical = msgspec.json.encode({"metadata": er.spec.metadata, "spec": er.spec.spec}, order="sorted")
    return hashlib.sha256(canonical).hexdigest()[:10]


def _runner_env(er: EphemeralRunner, secret_name: str, user_agent: str) -> list[JsonTree]:
    env: list[JsonTree] = [
        {
            "name": ENV_RUNNER_JIT_CONFIG,
            "valueFrom": {"secretKeyRef": {"name": secret_name, "key": SECRET_KEY_JIT_TOKEN}},
        },
        {"name": ENV_RUNNER_EXTRA_USER_AGENT, "value": user_agent},
        {"name": ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE, "value": "1"},
    ]
    proxy = er.spec.proxy
    if proxy is not None and er.spec.proxy_secret_ref:
        wanted = (
            ("http_proxy", proxy.http is not None),
            ("https_proxy", proxy.https is not None),
            ("no_proxy", bool(proxy.no_proxy)),
        )
        for key, on in wanted:
            if on:
                env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": er.spec.proxy_secret_ref, "key": key}}})
    return env


def build_runner_pod(
    er: EphemeralRunner,
    *,
    secret_name: str | None = None,
    user_agent: str = "runnerscale",
    exclude_label_prefixes: Iterable[str] = (),
) -> JsonTree:
    """The runner pod ``<ER name>`` built from the ER's inlined pod template.

    - labels: ER labels + template labels + ``actions-ephemeral-runner: True`` + ``pod-template-hash``;
    - annotations: ER annotations + template annotations, and the ER's actionable revision wins
      over anything the template says (the pod must carry the revision it was built from);
    - the container ``runner`` gets the JIT config (secretKeyRef), the user agent, the
      deprecated-version exit-code opt-in and the proxy env vars, replacing same-named entries;
    - ``restartPolicy: Never``: a restarted runner would reuse a spent JIT config.

    Raises :class:`PodBuildError` when the template has no container named ``runner``.
    """
    secret_name = secret_name or er.metadata.name
    template_meta = er.spec.metadata or {}
    labels = filter_labels(er.metadata.labels, exclude_label_prefixes)
    labels.update(filter_labels(template_meta.get("labels") or {}, exclude_label_prefixes))
    labels[LABEL_EPHEMERAL_RUNNER] = "True"
    labels[LABEL_POD_TEMPLATE_HASH] = pod_template_hash(er)
    annotations = dict(er.metadata.annotations)
    annotations.update(template_meta.get("annotations") or {})
    if ANNOTATION_ACTIONABLE_REVISION in er.metadata.annotations:
        annotations[ANNOTATION_ACTIONABLE_REVISION] = er.metadata.annotations[ANNOTATION_ACTIONABLE_REVISION]

    spec = copy.deepcopy(er.spec.spec or {})
    containers = spec.get("containers") or []
    runner = next((c for c in containers if isinstance(c, dict) and c.get("name") == RUNNER_CONTAINER_NAME), None)
    if runner is None:
        raise PodBuildError(f"the pod template has no container named {RUNNER_CONTAINER_NAME!r}")
    ours = _runner_env(er, secret_name, user_agent)
    names = {e["name"] for e in ours}
    kept = [e for e in runner.get("env") or [] if not (isinstance(e, dict) and e.get("name") in names)]
    runner["env"] = kept + ours
    spec["restartPolicy"] = "Never"

    metadata: JsonTree = {
        "name": er.metadata.name,
        "namespace": er.metadata.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(er)],
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
