"""tests/tools/helm.py without building: where the binary goes, what is pinned, and what a user is
told when Go is missing or the build fails (a fake `go` stands in for the compiler)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.tools import helm as tool

CONTROL_PLANE_K8S = "v0.37.2"


def test_version_and_cache_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tool.helm_version() == "v4.3.1"
    assert tool.helm_path() == tmp_path / "runnerscale" / "helm" / "v4.3.1" / "helm"


def test_wrapper_module_shares_the_control_planes_kubernetes_modules() -> None:
    go_mod = (tool.MODULE_DIR / "go.mod").read_text()
    k8s = dict(
        re.findall(
            r"^\s*(k8s\.io/(?:api|apimachinery|client-go|apiserver|apiextensions-apiserver)) (\S+)", go_mod, re.M
        )
    )
    assert set(k8s) == {
        "k8s.io/api",
        "k8s.io/apimachinery",
        "k8s.io/client-go",
        "k8s.io/apiserver",
        "k8s.io/apiextensions-apiserver",
    }
    assert set(k8s.values()) == {CONTROL_PLANE_K8S}
    assert (tool.MODULE_DIR / "go.sum").read_text().count("helm.sh/helm/v4 v4.3.1") == 2  # module + go.mod hashes


def test_missing_go_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tool, "go_binary", lambda: None)
    with pytest.raises(tool.HelmUnavailable, match=r"go\.dev/dl") as exc:
        tool.ensure_helm()
    assert "python -m tests.tools.helm build" in str(exc.value)
    assert tool.main(["build"]) == 1


def test_failed_build_reports_the_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake_go = tmp_path / "go"
    fake_go.write_text('#!/bin/sh\necho "compile: undefined: something.Broken" >&2\nexit 2\n')
    fake_go.chmod(0o755)
    monkeypatch.setattr(tool, "go_binary", lambda: str(fake_go))
    with pytest.raises(tool.HelmUnavailable, match=r"failed \(exit 2\)") as exc:
        tool.ensure_helm()
    assert "undefined: something.Broken" in str(exc.value)
    assert not tool.helm_path().exists()


def test_a_binary_that_is_not_the_pinned_helm_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A build that 'succeeds' with the wrong binary never lands in the cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake_go = tmp_path / "go"
    # writes a "helm" that reports another version to the -o path
    fake_go.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "-o" ]; do shift; done\n'
        'printf \'#!/bin/sh\\necho v3.0.0\\n\' > "$2"; chmod +x "$2"\n'
    )
    fake_go.chmod(0o755)
    monkeypatch.setattr(tool, "go_binary", lambda: str(fake_go))
    with pytest.raises(tool.HelmUnavailable, match=re.escape("reports 'v3.0.0', expected v4.3.1")):
        tool.ensure_helm()
    assert not tool.helm_path().exists()
