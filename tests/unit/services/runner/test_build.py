"""The runner worker's pure builders: JIT config Secret and runner pod."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from services.runner import build
from shared.api import EphemeralRunner, decode
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    ENV_RUNNER_EXTRA_USER_AGENT,
    ENV_RUNNER_JIT_CONFIG,
    ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE,
    LABEL_EPHEMERAL_RUNNER,
    LABEL_POD_TEMPLATE_HASH,
)


def er(
    *,
    spec: dict[str, Any] | None = None,
    template_meta: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    **extra: Any,
) -> EphemeralRunner:
    return decode(
        EphemeralRunner,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": {
                "name": "set-runner-abcde",
                "namespace": "arc",
                "uid": "u-1",
                "labels": {"app.kubernetes.io/component": "runner", "drop.me/x": "1"},
                "annotations": annotations
                if annotations is not None
                else {ANNOTATION_ACTIONABLE_REVISION: "4", "actions.github.com/patch-id": "9"},
            },
            "spec": {
                "githubConfigUrl": "https://github.com/o",
                "githubConfigSecret": "s",
                "runnerScaleSetId": 12,
                "metadata": template_meta or {"labels": {"team": "ci"}, "annotations": {"note": "t"}},
                "spec": spec
                or {
                    "containers": [
                        {
                            "name": "runner",
                            "image": "img",
                            "env": [{"name": "KEEP", "value": "1"}, {"name": ENV_RUNNER_JIT_CONFIG, "value": "user"}],
                        },
                        {"name": "dind", "image": "docker"},
                    ]
                },
                **extra,
            },
        },
    )


def test_jit_secret_shape() -> None:
    r = er(ephemeralRunnerConfigSecretMetadata={"labels": {"a": "b", "drop.me/y": "2"}, "annotations": {"c": "d"}})
    s = build.build_jit_secret(
        r, runner_id=77, runner_name="set-runner-abcde", encoded_jit_config="ZW5j", exclude_label_prefixes=("drop.me/",)
    )
    assert s["metadata"]["name"] == "set-runner-abcde" and s["metadata"]["namespace"] == "arc"
    assert s["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "name": "set-runner-abcde",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert s["metadata"]["labels"] == {"a": "b"} and s["metadata"]["annotations"] == {"c": "d"}
    data = {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
    assert data == {"jitToken": "ZW5j", "runnerName": "set-runner-abcde", "runnerId": "77", "scaleSetId": "12"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"77", 77), (b" 5\n", 5), (b"0", None), (b"-3", None), (b"x", None), (None, None), (b"\xff", None)],
)
def test_parse_runner_id(raw: bytes | None, expected: int | None) -> None:
    assert build.parse_runner_id(raw) == expected


def test_runner_pod_shape() -> None:
    p = build.build_runner_pod(er(), user_agent="runnerscale/1.0", exclude_label_prefixes=("drop.me/",))
    meta = p["metadata"]
    assert meta["name"] == "set-runner-abcde" and meta["ownerReferences"][0]["uid"] == "u-1"
    assert meta["labels"]["app.kubernetes.io/component"] == "runner"
    assert meta["labels"]["team"] == "ci"
    assert meta["labels"][LABEL_EPHEMERAL_RUNNER] == "True"
    assert meta["labels"][LABEL_POD_TEMPLATE_HASH]
    assert "drop.me/x" not in meta["labels"]
    assert meta["annotations"] == {ANNOTATION_ACTIONABLE_REVISION: "4", "actions.github.com/patch-id": "9", "note": "t"}
    assert p["spec"]["restartPolicy"] == "Never"
    runner, dind = p["spec"]["containers"]
    assert dind == {"name": "dind", "image": "docker"}
    names = [e["name"] for e in runner["env"]]
    assert names == [
        "KEEP",
        ENV_RUNNER_JIT_CONFIG,
        ENV_RUNNER_EXTRA_USER_AGENT,
        ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE,
    ]
    env = {e["name"]: e for e in runner["env"]}
    assert env[ENV_RUNNER_JIT_CONFIG]["valueFrom"] == {"secretKeyRef": {"name": "set-runner-abcde", "key": "jitToken"}}
    assert env[ENV_RUNNER_EXTRA_USER_AGENT]["value"] == "runnerscale/1.0"
    assert env[ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE]["value"] == "1"


def test_revision_annotation_of_the_er_wins_over_the_template() -> None:
    r = er(template_meta={"annotations": {ANNOTATION_ACTIONABLE_REVISION: "1"}})
    assert build.build_runner_pod(r)["metadata"]["annotations"][ANNOTATION_ACTIONABLE_REVISION] == "4"
    unstamped = er(annotations={}, template_meta={})
    assert ANNOTATION_ACTIONABLE_REVISION not in (
        build.build_runner_pod(unstamped)["metadata"].get("annotations") or {}
    )


def test_builder_does_not_mutate_the_er() -> None:
    r = er()
    before = [dict(c) for c in r.spec.spec["containers"]]
    build.build_runner_pod(r)
    assert r.spec.spec["containers"] == before


def test_proxy_env_vars_come_from_the_proxy_secret() -> None:
    r = er(
        proxy={"http": {"url": "http://p:3128"}, "https": {"url": "http://p:3128"}, "noProxy": ["example.com"]},
        proxySecretRef="proxy-secret",
    )
    runner = build.build_runner_pod(r)["spec"]["containers"][0]
    env = {e["name"]: e for e in runner["env"]}
    for key in ("http_proxy", "https_proxy", "no_proxy"):
        assert env[key]["valueFrom"] == {"secretKeyRef": {"name": "proxy-secret", "key": key}}
    only_http = er(proxy={"http": {"url": "http://p:3128"}}, proxySecretRef="proxy-secret")
    names = {e["name"] for e in build.build_runner_pod(only_http)["spec"]["containers"][0]["env"]}
    assert "http_proxy" in names and "https_proxy" not in names and "no_proxy" not in names


def test_no_runner_container_is_an_error() -> None:
    with pytest.raises(build.PodBuildError, match="runner"):
        build.build_runner_pod(er(spec={"containers": [{"name": "other", "image": "x"}]}))


def test_pod_template_hash_is_stable_and_follows_the_spec() -> None:
    assert build.pod_template_hash(er()) == build.pod_template_hash(er())
    assert build.pod_template_hash(er()) != build.pod_template_hash(
        er(spec={"containers": [{"name": "runner", "image": "other"}]})
    )
