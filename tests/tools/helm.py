"""helm for the tests and for people: built from the Go module proxy, cached outside the checkout.

No binary is downloaded: ``go build`` compiles ``helm.sh/helm/v4/cmd/helm`` inside the wrapper
module ``tests/tools/go/helm`` (its go.mod pins Helm and lifts Helm's k8s.io modules to the control
plane's v0.37.2, so the two builds share the Go build cache; its go.sum makes the build verifiable).
The binary lands in ``${XDG_CACHE_HOME:-~/.cache}/runnerscale/helm/<version>/helm`` and is reused
by every later run, checkout and worktree; a build takes a few minutes on 2 cores, later ones are
instant.

    python -m tests.tools.helm build     # build if missing, print the path
    python -m tests.tools.helm path      # print the path (exit 1 when not built)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent / "go" / "helm"
HELM_MODULE = "helm.sh/helm/v4"
BUILD_TIMEOUT = 3600.0  # seconds; a cold build on a loaded 2-core machine takes several minutes
GO_HINT = (
    "helm is built from the Go module proxy with Go >= 1.26 (`go` on PATH or /usr/local/go/bin/go). "
    "Install Go from https://go.dev/dl/ (e.g. tar -C /usr/local -xzf go1.26.*.linux-amd64.tar.gz) "
    "or your distribution's golang package, then run: python -m tests.tools.helm build"
)


class HelmUnavailable(RuntimeError):
    """helm cannot be had: Go is missing or the build failed (the message says what to do)."""


def helm_version() -> str:
    """The Helm version pinned in the wrapper module's go.mod (the single place to change it)."""
    text = (MODULE_DIR / "go.mod").read_text()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(HELM_MODULE)}\s+(v\S+)", text, re.MULTILINE)
    if found is None:
        raise HelmUnavailable(f"{MODULE_DIR / 'go.mod'} does not require {HELM_MODULE}")
    return found.group(1)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runnerscale" / "helm" / helm_version()


def helm_path() -> Path:
    return cache_dir() / "helm"


def go_binary() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if fallback.exists() else None


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """One build at a time across processes (parallel test runs, several worktrees)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ldflags(version: str) -> str:
    # What Helm's own Makefile sets for a tagged release, so `helm version` tells the truth.
    pkg = f"{HELM_MODULE}/internal/version"
    return f"-s -w -X {pkg}.version={version} -X {pkg}.metadata= -X {pkg}.gitTreeState=clean"


def _reported_version(binary: Path) -> str:
    result = subprocess.run(
        [str(binary), "version", "--template", "{{.Version}}"], check=False, capture_output=True, text=True, timeout=60
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def ensure_helm(*, output: int | None = None) -> Path:
    """The cached helm binary, built first when missing. Raises :class:`HelmUnavailable` with the
    way out (Go missing, build failed: the log's tail is in the message)."""
    target = helm_path()
    version = helm_version()
    if target.exists() and _reported_version(target) == version:
        return target
    go = go_binary()
    if go is None:
        raise HelmUnavailable(GO_HINT)
    with _build_lock(target.parent):
        if target.exists() and _reported_version(target) == version:
            return target  # built by another process while we waited
        log_path = target.parent / "build.log"
        env = {
            **os.environ,
            "CGO_ENABLED": "0",
            # Never fetch a Go toolchain: an older `go` fails with its own message instead.
            "GOTOOLCHAIN": "local",
            "GOFLAGS": "-mod=readonly -buildvcs=false",
        }
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / "helm"
            command = [
                go,
                "build",
                "-trimpath",
                "-ldflags",
                _ldflags(version),
                "-o",
                str(built),
                f"{HELM_MODULE}/cmd/helm",
            ]
            with open(log_path, "w") as log:
                log.write(f"$ (cd {MODULE_DIR} && {' '.join(command)})\n")
                log.flush()
                try:
                    result = subprocess.run(
                        command,
                        check=False,
                        cwd=MODULE_DIR,
                        env=env,
                        stdout=output if output is not None else log,
                        stderr=subprocess.STDOUT,
                        timeout=BUILD_TIMEOUT,
                    )
                except subprocess.TimeoutExpired:
                    raise HelmUnavailable(
                        f"building helm {version} took over {BUILD_TIMEOUT:.0f} s; log: {log_path}"
                    ) from None
            if result.returncode != 0:
                tail = "".join(log_path.read_text().splitlines(keepends=True)[-25:])
                raise HelmUnavailable(f"building helm {version} failed (exit {result.returncode}); {log_path}:\n{tail}")
            got = _reported_version(built)
            if got != version:
                raise HelmUnavailable(f"the helm built from {MODULE_DIR} reports {got!r}, expected {version}")
            os.replace(built, target)  # atomic: a concurrent reader sees the old file or the new one
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "build"
    if command == "path":
        path = helm_path()
        print(path)
        return 0 if path.exists() else 1
    if command == "build":
        try:
            print(ensure_helm(output=sys.stderr.fileno()))
        except HelmUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m tests.tools.helm [build|path]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
