"""Unit tests of the emulator's pure semantics: selectors, patch engines, schema, generation."""

from __future__ import annotations

import re
from typing import Any

import pytest

from services.embedded.apiserver import admission, discovery
from services.embedded.apiserver.api import _spec_changed, decode_continue, encode_continue
from services.embedded.apiserver.errors import ApiError
from services.embedded.apiserver.patch import (
    PatchError,
    PatchFailed,
    PatchTypeError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
    smp_rules_for,
)
from services.embedded.apiserver.resources import builtin_types, types_from_crd
from services.embedded.apiserver.schema import process_custom_object
from services.embedded.apiserver.selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    parse_query_bool,
)
from services.embedded.apiserver.store import Event, Watcher, WatchFilter

POD_RULES = smp_rules_for("Pod")


def obj(labels: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "x", "namespace": "ns", "labels": labels or {}}, **fields}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a=b", {}, False),
        ("a!=b", {}, True),
        ("a notin (b,c)", {"a": "d"}, True),
        ("a notin (b,c)", {}, True),
        ("a in (b, c)", {"a": "c"}, True),
        ("a,!b", {"a": "1"}, True),
        ("a,!b", {"a": "1", "b": "2"}, False),
        ("example.com/x=y", {"example.com/x": "y"}, True),
        ("", {"z": "1"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert labels_match(parse_label_selector(selector), obj(labels)) is expected


@pytest.mark.parametrize("bad", ["a in b", "=b", "a=b,,c", "a b", "a=(b)"])
def test_malformed_label_selectors(bad: str) -> None:
    with pytest.raises(ApiError) as exc:
        parse_label_selector(bad)
    assert exc.value.code == 400


def test_field_selectors() -> None:
    pod = obj(spec={"nodeName": "n1"}, status={"phase": "Running"})
    supported = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase")
    assert fields_match(parse_field_selector("status.phase=Running,spec.nodeName!=n2", supported), pod)
    assert not fields_match(parse_field_selector("spec.nodeName=", supported), pod)
    with pytest.raises(ApiError, match=re.escape("field label not supported: spec.x")):
        parse_field_selector("spec.x=1", supported)


def test_query_bool() -> None:
    assert parse_query_bool("True") and parse_query_bool("1") and parse_query_bool("yes") and parse_query_bool("")
    assert not parse_query_bool(None) and not parse_query_bool("0") and not parse_query_bool("fALSe")


def test_merge_patch_rfc7386() -> None:
    assert apply_merge_patch({"a": "b", "c": {"d": "e", "f": "g"}}, {"a": "z", "c": {"f": None}}) == {
        "a": "z",
        "c": {"d": "e"},
    }
    assert apply_merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    assert apply_merge_patch({"a": 1}, {"b": {"c": None}}) == {"a": 1, "b": {}}


def test_json_patch_ops_and_failures() -> None:
    doc = {"a": {"b": [1, 2]}}
    out = apply_json_patch(
        doc,
        [
            {"op": "add", "path": "/a/b/1", "value": 9},
            {"op": "move", "from": "/a/b", "path": "/c"},
            {"op": "test", "path": "/c/0", "value": 1},
        ],
    )
    assert out == {"a": {}, "c": [1, 9, 2]} and doc == {"a": {"b": [1, 2]}}
    with pytest.raises(PatchFailed):
        apply_json_patch(doc, [{"op": "replace", "path": "/nope", "value": 1}])
    with pytest.raises(PatchFailed):
        apply_json_patch(doc, [{"op": "test", "path": "/a/b/0", "value": 2}])


def test_smp_containers_env_ports_mounts() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "env": [{"name": "X", "value": "1"}],
                    "ports": [{"containerPort": 80}],
                    "volumeMounts": [{"name": "v", "mountPath": "/m"}],
                },
                {"name": "b"},
            ]
        }
    }
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "env": [{"name": "X", "value": "2"}, {"name": "Y", "value": "3"}],
                    "ports": [{"containerPort": 81}],
                    "volumeMounts": [{"name": "w", "mountPath": "/n"}],
                },
                {"name": "c"},
            ]
        }
    }
    out = apply_strategic_merge_patch(pod, patch, POD_RULES)
    a = out["spec"]["containers"][0]
    # The patch's items keep their order; stored-only items are interleaved by stored position.
    assert [c["name"] for c in out["spec"]["containers"]] == ["a", "c", "b"]
    assert a["env"] == [{"name": "X", "value": "2"}, {"name": "Y", "value": "3"}]
    assert [p["containerPort"] for p in a["ports"]] == [81, 80]
    assert [m["mountPath"] for m in a["volumeMounts"]] == ["/n", "/m"]


def test_smp_directives() -> None:
    pod = {
        "spec": {
            "containers": [{"name": "a"}, {"name": "b"}],
            "tolerations": [{"key": "x"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        }
    }
    assert apply_strategic_merge_patch(pod, {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}, POD_RULES)[
        "spec"
    ]["containers"] == [{"name": "b"}]
    assert apply_strategic_merge_patch(pod, {"spec": {"tolerations": [{"key": "y"}]}}, POD_RULES)["spec"][
        "tolerations"
    ] == [{"key": "y"}]
    out = apply_strategic_merge_patch(pod, {"spec": {"containers": [{"name": "z"}, {"$patch": "replace"}]}}, POD_RULES)
    assert out["spec"]["containers"] == [{"name": "z"}]
    out = apply_strategic_merge_patch(
        pod, {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}}, POD_RULES
    )
    assert [c["name"] for c in out["spec"]["containers"]] == ["b", "a"]
    out = apply_strategic_merge_patch(
        pod,
        {"spec": {"volumes": [{"name": "v", "secret": {"secretName": "s"}, "$retainKeys": ["name", "secret"]}]}},
        POD_RULES,
    )
    assert out["spec"]["volumes"] == [{"name": "v", "secret": {"secretName": "s"}}]
    with pytest.raises(PatchError):
        apply_strategic_merge_patch(pod, {"spec": {"containers": [{"image": "no-name"}]}}, POD_RULES)
    # Unknown "$" keys are plain keys; an unknown $patch value is the server's 500.
    assert apply_strategic_merge_patch(pod, {"$unknown": 1}, POD_RULES)["$unknown"] == 1
    with pytest.raises(PatchTypeError, match=r"unknown patch type: x in map: map\[\$patch:x a:1\]"):
        apply_strategic_merge_patch(pod, {"spec": {"$patch": "x", "a": 1}}, POD_RULES)


def test_smp_finalizer_set() -> None:
    rules = smp_rules_for("ConfigMap")
    cm = {"metadata": {"finalizers": ["a"]}}
    assert apply_strategic_merge_patch(cm, {"metadata": {"finalizers": ["b", "a"]}}, rules)["metadata"][
        "finalizers"
    ] == ["b", "a"]
    three = {"metadata": {"finalizers": ["a", "b", "c"]}}
    assert apply_strategic_merge_patch(three, {"metadata": {"finalizers": ["d", "b", "e"]}}, rules)["metadata"][
        "finalizers"
    ] == ["d", "a", "b", "e", "c"]
    assert (
        apply_strategic_merge_patch(cm, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, rules)["metadata"]
        == {}
    )


SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["image"],
            "properties": {
                "image": {"type": "string", "maxLength": 5},
                "ports": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"p": {"type": "integer"}, "protocol": {"type": "string", "default": "TCP"}},
                    },
                },
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "map": {"type": "object", "additionalProperties": {"type": "integer"}},
                "opt": {"type": "object", "properties": {"x": {"type": "string", "default": "d"}}},
            },
        }
    },
}


def test_schema_prune_default_validate() -> None:
    body = {
        "apiVersion": "g/v1",
        "kind": "K",
        "metadata": {"name": "n"},
        "spec": {"image": "abc", "junk": 1, "ports": [{"p": 1, "zz": 2}], "free": {"any": [1]}, "map": {"a": 1}},
        "top": 1,
    }
    out, pruned, causes = process_custom_object(body, SCHEMA)
    assert sorted(pruned) == ["spec.junk", "spec.ports[0].zz", "top"]
    assert out["spec"]["ports"] == [{"p": 1, "protocol": "TCP"}]
    assert out["spec"]["free"] == {"any": [1]} and "opt" not in out["spec"]
    assert causes == []
    _, _, causes = process_custom_object({"spec": {"image": "toolong", "map": {"a": "x"}}}, SCHEMA)
    assert {c.field for c in causes} == {"spec.image", "spec.map.a"}
    _, _, causes = process_custom_object({"spec": {}}, SCHEMA)
    assert [(c.reason, c.field) for c in causes] == [("FieldValueRequired", "spec.image")]


def test_generation_rules() -> None:
    widget = types_from_crd(
        {
            "metadata": {"name": "ws.g"},
            "spec": {
                "group": "g",
                "names": {"kind": "W", "plural": "ws"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "subresources": {"status": {}}}],
            },
        }
    )[0]
    gadget = types_from_crd(
        {
            "metadata": {"name": "gs.g"},
            "spec": {
                "group": "g",
                "names": {"kind": "G", "plural": "gs"},
                "scope": "Namespaced",
                "versions": [{"name": "v1"}],
            },
        }
    )[0]
    old = {"metadata": {"labels": {}}, "spec": {"a": 1}, "status": {"s": 1}}
    assert not _spec_changed(widget, old, {**old, "metadata": {"labels": {"x": "y"}}})
    assert not _spec_changed(widget, old, {**old, "status": {"s": 2}})
    assert _spec_changed(gadget, old, {**old, "status": {"s": 2}})
    assert _spec_changed(widget, old, {**old, "spec": {"a": 2}})
    assert _spec_changed(widget, old, {**old, "extra": 1})
    pod = next(t for t in builtin_types() if t.kind == "Pod")
    assert not _spec_changed(pod, old, {**old, "status": {"s": 2}})


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("busybox:1.36", "IfNotPresent"),
        ("localhost:5000/x", "Always"),
        ("x@sha256:abc", "IfNotPresent"),
    ],
)
def test_image_pull_policy(image: str, policy: str) -> None:
    assert admission.image_pull_policy(image) == policy


def test_continue_token_round_trip_and_garbage() -> None:
    assert decode_continue(encode_continue(42, "ns/name")) == (42, "ns/name")
    with pytest.raises(ApiError) as exc:
        decode_continue("bm90IGpzb24")
    assert exc.value.code == 400


def test_watcher_selector_transitions() -> None:
    w = Watcher(WatchFilter("g/ws", "ns", parse_label_selector("a=b")), 10)
    base = obj({"a": "c"})
    match = obj({"a": "b"})
    w.offer(Event(2, "MODIFIED", "g/ws", "ns", "x", match, base))
    w.offer(Event(3, "MODIFIED", "g/ws", "ns", "x", match, match))
    w.offer(Event(4, "MODIFIED", "g/ws", "ns", "x", base, match))
    w.offer(Event(5, "ADDED", "other/ws", "ns", "x", match, None))
    assert [(e.type, e.rv) for e in w.pending] == [("ADDED", 2), ("MODIFIED", 3), ("DELETED", 4)]
    assert w.pending[2].obj["metadata"]["resourceVersion"] == "4"


def test_slow_watcher_is_closed_not_blocking() -> None:
    w = Watcher(WatchFilter("g/ws", None), 2)
    for rv in range(5):
        w.offer(Event(rv, "ADDED", "g/ws", "ns", f"x{rv}", obj(), None))
    assert w.closed_reason == "slow consumer"


def test_human_duration_and_jsonpath() -> None:
    assert [discovery.human_duration(s) for s in (5, 119, 150, 3600, 90000)] == ["5s", "119s", "2m30s", "60m", "25h"]
    doc = {"spec": {"a": [{"b": 1}, {"b": 2}], "k.x": "v"}}
    assert discovery.jsonpath_values(doc, ".spec.a[*].b") == [1, 2]
    assert discovery.jsonpath_values(doc, ".spec.a[1].b") == [2]
    assert discovery.jsonpath_values(doc, "{.spec['k.x']}") == ["v"]
    assert discovery.jsonpath_values(doc, ".spec.missing") == []


def test_protobuf_envelope_errors() -> None:
    from services.embedded.apiserver.protobuf import ProtobufError, decode_object

    with pytest.raises(ProtobufError, match="envelope"):
        decode_object(b"{}")
    # Envelope for apps/v1 Deployment: TypeMeta{apiVersion="apps/v1", kind="Deployment"}, no raw.
    type_meta = b"\x0a\x07apps/v1\x12\x0aDeployment"
    with pytest.raises(ProtobufError, match="not supported"):
        decode_object(b"k8s\x00" + b"\x0a" + bytes([len(type_meta)]) + type_meta)
    with pytest.raises(ProtobufError, match="truncated"):
        decode_object(b"k8s\x00\x0a\x50")


def test_schema_null_and_embedded_resources() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "default": 3},
                    "maybe": {"type": "string", "nullable": True},
                    "tmpl": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": True,
                        "properties": {"spec": {"type": "object"}},
                    },
                },
            }
        },
    }
    out, pruned, causes = process_custom_object(
        {
            "spec": {
                "n": None,
                "maybe": None,
                "tmpl": {"apiVersion": "v1", "kind": "Pod", "metadata": {"a": 1}, "spec": {}, "x": 1},
            }
        },
        schema,
    )
    assert out["spec"]["n"] == 3 and out["spec"]["maybe"] is None and causes == []
    assert out["spec"]["tmpl"] == {"apiVersion": "v1", "kind": "Pod", "metadata": {"a": 1}, "spec": {}}
    assert pruned == ["spec.tmpl.x"]


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("0.5", "500m"),
        ("1000m", "1"),
        ("2000", "2k"),
        ("1500", "1500"),
        ("129e6", "129e6"),
        ("128974848", "128974848"),
        ("0.5Ki", "512"),
        ("1000M", "1G"),
        ("0", "0"),
        ("0.1n", "1n"),
        (4, "4"),
    ],
)
def test_quantity_canonical_form(given: str | int, canonical: str) -> None:
    from services.embedded.apiserver.quantity import canonical as canon

    assert canon(given) == canonical


def test_quantity_rejects_garbage() -> None:
    from services.embedded.apiserver.quantity import QuantityError
    from services.embedded.apiserver.quantity import canonical as canon

    for bad in ("lots", "1Xi", ".", ""):
        with pytest.raises(QuantityError):
            canon(bad)
