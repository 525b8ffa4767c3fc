"""The control-plane tool's decisions: versions from the wrapper modules, version ldflags, PKI,
kubeconfigs, and the CLI's answers when nothing runs or Go is missing (no servers started)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.controlplane import build, cluster, pki
from tests.support import paths

REPO = paths.REPO


def test_versions_come_from_the_wrapper_modules() -> None:
    versions = build.pinned_versions()
    assert versions.kubernetes == "v1.37.2" and versions.etcd == "v3.6.16"
    assert versions.label == "kube-v1.37.2_etcd-v3.6.16"
    assert (
        build.required_version("module x\n\nrequire (\n\tfoo.io/bar v1.2.3 // indirect\n)\n", "foo.io/bar") == "v1.2.3"
    )
    with pytest.raises(build.BuildError, match=r"does not require foo\.io/baz"):
        build.required_version("module x\n", "foo.io/baz")


def test_every_staging_module_is_replaced_by_its_published_release() -> None:
    lines = [line for line in (build.KUBE_MODULE / "go.mod").read_text().splitlines() if not line.startswith("//")]
    replaces = [line.split() for line in lines if "=>" in line]
    assert len(replaces) >= 30 and not any("./staging" in line for line in lines)
    for left, _, right, version in replaces:
        assert left == right and left.startswith("k8s.io/") and version == "v0.37.2"


def test_version_ldflags_fill_every_version_field() -> None:
    digest = hashlib.sha256(b"source").digest()
    flags = build.kube_version_ldflags("v1.37.2", "h1:" + base64.b64encode(digest).decode(), "2026-10-27T12:01:04Z")
    values = dict(f.removeprefix("-X k8s.io/component-base/version.").split("=", 1) for f in flags if "component" in f)
    assert values == {
        "gitVersion": "v1.37.2",
        "gitMajor": "1",
        "gitMinor": "37",
        "gitCommit": digest[:20].hex(),
        "gitTreeState": "clean",
        "buildDate": "2026-10-27T12:01:04Z",
    }
    assert len(flags) == 12 and sum("k8s.io/client-go/pkg/version." in f for f in flags) == 6
    with pytest.raises(build.BuildError):
        build.kube_version_ldflags("master", "h1:AAAA", "x")
    with pytest.raises(build.BuildError):
        build.commit_from_module_sum("sha256:abc")


def test_the_cache_key_changes_with_the_wrapper_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = build.cache_dir(build.pinned_versions(), "go1.26.8")
    assert key.parent == tmp_path / "runnerscale" / "controlplane"
    assert key.name.startswith("kube-v1.37.2_etcd-v3.6.16_go1.26.8_")
    module = tmp_path / "go"
    (module / "m").mkdir(parents=True)
    (module / "m" / "go.mod").write_text("module m\n")
    monkeypatch.setattr(build, "GO_DIR", module)
    first = build.source_digest()
    (module / "m" / "go.mod").write_text("module m\n\ngo 1.26.0\n")
    assert build.source_digest() != first


def test_missing_go_fails_with_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNNERSCALE_GO", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(build.BuildError) as err:
        build.go_binary()
    assert "https://go.dev/doc/install" in str(err.value) and "RUNNERSCALE_GO" in str(err.value)
    monkeypatch.setenv("RUNNERSCALE_GO", "/nonexistent/go")
    with pytest.raises(build.BuildError, match=r"go\.dev/doc/install"):
        build.go_version(build.go_binary())


def test_pki_chains_to_one_ca_with_the_right_identities(tmp_path: Path) -> None:
    keys = pki.generate(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(keys.ca.cert.read_bytes())

    def load(pair: pki.Pair) -> x509.Certificate:
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(days=29)
        return cert

    serving = load(keys.apiserver)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert {"localhost", "kubernetes.default.svc"} <= set(sans.get_values_for_type(x509.DNSName))
    assert ExtendedKeyUsageOID.SERVER_AUTH in serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    admin = load(keys.admin)
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    kcm = load(keys.controller_manager)
    assert kcm.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:kube-controller-manager"
    assert keys.service_account_key.stat().st_mode & 0o077 == 0 and keys.admin.key.stat().st_mode & 0o077 == 0
    public = x509.load_pem_x509_certificate(keys.admin.cert.read_bytes()).public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)


def test_kubeconfig_is_self_contained(tmp_path: Path) -> None:
    keys = pki.generate(tmp_path)
    doc = cluster.kubeconfig_doc("https://127.0.0.1:6443", keys.ca.cert, keys.admin.cert, keys.admin.key, "admin")
    text = yaml.safe_dump(doc)
    assert str(tmp_path) not in text
    user = doc["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == keys.admin.cert.read_bytes()
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"


def test_state_round_trips_and_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    running = cluster.Running(
        state_dir=str(tmp_path),
        server="https://127.0.0.1:1",
        kubeconfig=str(tmp_path / "admin.kubeconfig"),
        components=[cluster.Component(name="etcd", pid=1, exe="/nonexistent/etcd", log="x")],
    )
    running.save()
    assert cluster.Running.load(tmp_path) == running
    assert cluster.Running.load(tmp_path / "none") is None
    # pid 1 runs, but not /nonexistent/etcd: `down` must not signal it.
    assert not cluster.alive(running.components[0])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.controlplane", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_without_a_running_control_plane(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    env = _cli("env", "--state-dir", state)
    assert env.returncode == 1 and "not running" in env.stderr and "up" in env.stderr
    down = _cli("down", "--state-dir", state)
    assert down.returncode == 0 and "not running" in down.stderr
    bad = _cli("start")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
