"""`runnerscale apiserver --tls`: HTTPS with a generated CA that the kubeconfig carries and
every namespace's kube-root-ca.crt holds (what in-cluster clients verify the server with), and
TokenRequest (``serviceaccounts/<name>/token``). Runs its own emulator process."""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml

from .conftest import Http


def _call(url: str, context: ssl.SSLContext, body: object = None) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:
        reply: dict[str, Any] = json.loads(resp.read())
        return reply


def test_tls_emulator_process(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    cmd = [sys.executable, "-m", "shared.cli", "apiserver", "--tls", "--kubeconfig-out", str(kubeconfig)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("https://127.0.0.1:"), url
        cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
        assert cluster["server"] == url
        ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        trusted = ssl.create_default_context(cadata=ca_pem)

        # The server certificate verifies against the kubeconfig's CA (and only against it).
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(url + "/readyz", timeout=10, context=ssl.create_default_context())
        root = _call(url + "/api/v1/namespaces/default/configmaps/kube-root-ca.crt", trusted)
        assert root["data"]["ca.crt"] == ca_pem

        answer = _call(
            url + "/api/v1/namespaces/default/serviceaccounts/default/token",
            trusted,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3607}},
        )
        assert answer["kind"] == "TokenRequest" and answer["spec"]["expirationSeconds"] == 3607
        claims = jwt.decode(answer["status"]["token"], options={"verify_signature": False})
        assert claims["sub"] == "system:serviceaccount:default:default"
        assert claims["aud"] == ["https://kubernetes.default.svc"] and claims["exp"] - claims["iat"] == 3607
        with pytest.raises(urllib.error.HTTPError) as short:
            _call(
                url + "/api/v1/namespaces/default/serviceaccounts/default/token",
                trusted,
                {"spec": {"expirationSeconds": 10}},
            )
        assert short.value.code == 422
        assert json.loads(short.value.read())["message"] == (
            'TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: '
            "Invalid value: 10: may not specify a duration less than 10 minutes"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.anyio
async def test_token_request_answers_as_the_real_server(http: Http, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default/token"
    status, body = await http.post(path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})
    assert status == 201, body
    assert body["kind"] == "TokenRequest" and body["apiVersion"] == "authentication.k8s.io/v1"
    assert body["metadata"]["name"] == "default" and body["metadata"]["namespace"] == namespace
    assert body["spec"]["audiences"] == ["https://kubernetes.default.svc"]
    assert body["spec"]["expirationSeconds"] == 3600
    claims = jwt.decode(body["status"]["token"], options={"verify_signature": False})
    assert claims["sub"] == f"system:serviceaccount:{namespace}:default"
    status, body = await http.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/nope/token", {"spec": {}})
    assert status == 404, body
    assert body["message"] == 'serviceaccounts "nope" not found'
