"""Protobuf request bodies of every built-in kind decode exactly like their JSON form.

``bodies`` (built from the Go module proxy) encodes one rich object per kind with
apimachinery's own JSON and protobuf serializers. Each is created both ways as a dry run
(nothing is stored, names can repeat) and the two answers must be the same object: the real
server decodes both into one Go struct, so the emulator's protobuf decoding must give exactly
what its JSON decoding gives.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.apiserver import KubeApi, new_api_client

pytestmark = pytest.mark.anyio
PROTOBUF = "application/vnd.kubernetes.protobuf"


def _bodies(program: Path, namespace: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(program), "-namespace", namespace, "-name-suffix", secrets.token_hex(3)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def _normalised(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop what differs between any two creates of one object (identity, time, random names)."""
    meta = obj.get("metadata") or {}
    for k in ("uid", "creationTimestamp", "managedFields", "resourceVersion"):
        meta.pop(k, None)
    spec = obj.get("spec") if obj.get("kind") == "Pod" else None
    if isinstance(spec, dict):
        for v in spec.get("volumes") or []:
            if v.get("name", "").startswith("kube-api-access-"):
                v["name"] = "kube-api-access"
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            for m in c.get("volumeMounts") or []:
                if m.get("name", "").startswith("kube-api-access-"):
                    m["name"] = "kube-api-access"
    return obj


@pytest.mark.timeout(1800)  # includes the Go build on a cold cache
async def test_protobuf_and_json_bodies_create_the_same_objects(
    go_programs: dict[str, Path], kube_api: KubeApi, namespace: str
) -> None:
    api = await new_api_client(kube_api.kubeconfig)
    async with api:

        async def create(path: str, body: Any, content_type: str) -> tuple[int, dict[str, Any]]:
            from kubernetes_asyncio.client.exceptions import ApiException

            try:
                resp = await api.call_api(
                    path,
                    "POST",
                    query_params=[("dryRun", "All")],
                    header_params={"Content-Type": content_type, "Accept": "application/json"},
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _request_timeout=30,
                )
                return resp.status, json.loads(await resp.read())
            except ApiException as exc:
                assert exc.body is not None, exc
                return exc.status, json.loads(exc.body)

        kinds = []
        for item in _bodies(go_programs["bodies"], namespace):
            kinds.append(item["kind"])
            from_json = await create(item["path"], item["json"], "application/json")
            from_pb = await create(item["path"], base64.b64decode(item["protobuf"]), PROTOBUF)
            assert from_json[0] == 201, (item["kind"], from_json)
            assert from_pb[0] == 201, (item["kind"], from_pb)
            assert _normalised(from_pb[1]) == _normalised(from_json[1]), item["kind"]
    assert len(kinds) == 12
