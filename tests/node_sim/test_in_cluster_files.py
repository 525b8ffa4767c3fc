"""The pure parts of what node-sim gives in-cluster clients: env, token sources, volume files."""

from __future__ import annotations

import pytest

from services.embedded.node_sim.podspec import (
    SERVICE_ACCOUNT_DIR,
    MountError,
    Objects,
    TokenSource,
    in_cluster_env,
    token_request_body,
    token_sources,
    volume_files,
)

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"b": "2", "a": "1"}},
    "spec": {
        "serviceAccountName": "default",
        "volumes": [
            {
                "name": "kube-api-access-abcde",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {
                            "downwardAPI": {
                                "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                            }
                        },
                    ],
                },
            },
            {
                "name": "info",
                "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
            },
        ],
    },
}
OBJECTS: Objects = {("configmaps", "kube-root-ca.crt"): {"data": {"ca.crt": "PEM"}}}


def test_service_variables_only_for_https() -> None:
    mounts = [(SERVICE_ACCOUNT_DIR, "/state/p/volumes/kube-api-access-abcde")]
    env = in_cluster_env("https://127.0.0.1:6443", mounts)
    assert env == {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "6443",
        "KUBERNETES_PORT": "tcp://127.0.0.1:6443",
        "RUNNERSCALE_SERVICEACCOUNT_DIR": "/state/p/volumes/kube-api-access-abcde",
    }
    # Plain HTTP (the default emulator): an in-cluster client could not connect, so no variables
    # that would make one try; no mount, no directory.
    assert in_cluster_env("http://127.0.0.1:8080", []) == {}


def test_token_sources_and_request() -> None:
    (src,) = token_sources(POD)
    assert src == TokenSource(volume="kube-api-access-abcde", path="token", audience="", expiration_seconds=3607)
    assert token_request_body(src) == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3607},
    }


def test_projected_and_downward_files() -> None:
    files = volume_files(POD, OBJECTS, {("kube-api-access-abcde", "token"): b"jwt"})
    assert sorted(files["kube-api-access-abcde"]) == [
        ("ca.crt", b"PEM", 420),
        ("namespace", b"ns", 420),
        ("token", b"jwt", 420),
    ]
    assert files["info"] == [("labels", b'a="1"\nb="2"', 0o644)]
    # Pods whose files are not written need no token; a process pod without one cannot mount.
    assert "token" not in [f[0] for f in volume_files(POD, OBJECTS, None)["kube-api-access-abcde"]]
    with pytest.raises(MountError, match="no service account token"):
        volume_files(POD, OBJECTS, {})
