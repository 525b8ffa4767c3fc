"""Pure parts of the layer: keys, paths, selectors, patch construction, body preparation."""

from __future__ import annotations

import pytest

from shared.api import ObjectMeta, OwnerReference
from shared.kube import (
    EPHEMERAL_RUNNERS,
    LEASES,
    NAMESPACES,
    PODS,
    InvalidKey,
    ObjectKey,
    SelectorError,
    controller_owner_key,
    parse_label_selector,
)
from shared.kube.codec import object_body
from shared.kube.objects import Pod, Secret, SecretDataError
from shared.kube.writer import finalizers_patch, with_resource_version

from .conftest import ers


def test_object_keys() -> None:
    assert ObjectKey.parse("ns/name") == ObjectKey("ns", "name") and str(ObjectKey("ns", "n")) == "ns/n"
    assert ObjectKey.parse("cluster-wide") == ObjectKey("", "cluster-wide")
    assert ObjectKey.of(("a", "b")) == ObjectKey("a", "b")
    for bad in ("", "a/b/c", "/x", "ns/", 42, None):
        with pytest.raises(InvalidKey):
            ObjectKey.of(bad)  # type: ignore[arg-type]


def test_paths() -> None:
    assert (
        EPHEMERAL_RUNNERS.object_path(ObjectKey("ns", "r"), "status")
        == "/apis/actions.github.com/v1alpha1/namespaces/ns/ephemeralrunners/r/status"
    )
    assert PODS.collection_path(None) == "/api/v1/pods" and PODS.collection_path("ns") == "/api/v1/namespaces/ns/pods"
    assert LEASES.object_path(ObjectKey("ns", "l")) == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
    assert NAMESPACES.object_path(ObjectKey("", "ns")) == "/api/v1/namespaces/ns"
    with pytest.raises(InvalidKey, match="needs a namespace"):
        PODS.object_path(ObjectKey("", "p"))
    assert PODS.describe("PATCH", ObjectKey("ns", "p"), "status") == "PATCH pods ns/p/status"


def test_label_selectors_have_server_semantics() -> None:
    labels = {"app": "runner", "tier": "a"}
    cases = {
        "app=runner": True,
        "app==runner,tier=a": True,
        "app!=runner": False,
        "missing!=x": True,
        "tier in (a, b)": True,
        "tier notin (a)": False,
        "missing notin (a)": True,
        "app": True,
        "!app": False,
        "!missing": True,
        "": True,
    }
    for text, expected in cases.items():
        assert parse_label_selector(text).matches(labels) is expected, text
    for bad in ("a in (b", "=x", "a b c"):
        with pytest.raises(SelectorError):
            parse_label_selector(bad)


def test_merge_patch_lock_and_finalizer_lists() -> None:
    patch = {"metadata": {"labels": {"a": "b"}}, "spec": {"x": 1}}
    locked = with_resource_version(patch, "42")
    assert locked == {"metadata": {"labels": {"a": "b"}, "resourceVersion": "42"}, "spec": {"x": 1}}
    assert patch == {"metadata": {"labels": {"a": "b"}}, "spec": {"x": 1}}  # caller's dict untouched
    assert with_resource_version({"spec": {}}, None) == {"spec": {}}
    with pytest.raises(TypeError):
        with_resource_version([{"op": "add"}], "1")  # type: ignore[arg-type]
    assert finalizers_patch(["a"], add="b") == ["a", "b"] and finalizers_patch(["a"], add="a") is None
    assert finalizers_patch(["a", "b"], remove="a") == ["b"] and finalizers_patch(["a"], remove="z") is None


def test_object_body_sets_type_meta_and_drops_resource_version() -> None:
    body = object_body(
        PODS, Pod(metadata=ObjectMeta(name="p", namespace="ns", resource_version="9"), spec={"containers": []})
    )
    assert body["apiVersion"] == "v1" and body["kind"] == "Pod" and "resourceVersion" not in body["metadata"]
    tree = object_body(EPHEMERAL_RUNNERS, {"metadata": {"name": "x", "resourceVersion": "3"}})
    assert tree["apiVersion"] == "actions.github.com/v1alpha1" and tree["metadata"] == {"name": "x"}
    with pytest.raises(TypeError):
        object_body(PODS, "not an object")


def test_controller_owner_key_matches_kind_and_group() -> None:
    owner = ers("ns", "set")
    ref = OwnerReference(
        api_version="actions.github.com/v1alpha1", kind="EphemeralRunnerSet", name="set", uid="u", controller=True
    )
    child = Pod(metadata=ObjectMeta(name="p", namespace="ns", owner_references=[ref]))
    assert controller_owner_key(child, "EphemeralRunnerSet") == ObjectKey("ns", owner.metadata.name)
    assert controller_owner_key(child, "EphemeralRunner") is None
    foreign = Pod(
        metadata=ObjectMeta(
            name="p",
            namespace="ns",
            owner_references=[
                OwnerReference(api_version="apps/v1", kind="EphemeralRunnerSet", name="s", uid="u", controller=True)
            ],
        )
    )
    assert controller_owner_key(foreign, "EphemeralRunnerSet") is None
    not_controller = Pod(
        metadata=ObjectMeta(
            name="p",
            namespace="ns",
            owner_references=[
                OwnerReference(api_version="actions.github.com/v1alpha1", kind="EphemeralRunnerSet", name="s", uid="u")
            ],
        )
    )
    assert controller_owner_key(not_controller, "EphemeralRunnerSet") is None


def test_secret_data_decoding() -> None:
    secret = Secret(metadata=ObjectMeta(name="s", namespace="ns"), data={"ok": "aGk=", "bad": "!!"})
    assert secret.decoded("ok") == b"hi" and secret.decoded("missing") is None
    with pytest.raises(SecretDataError, match="ns/s"):
        secret.decoded("bad")
