"""deploy/Dockerfile, read statically (no Docker engine here to build it): python:3.11-slim,
`pip install .`, a numeric non-root user matching the manifests' runAsUser, entrypoint runnerscale,
and a build context holding what `pip install .` needs."""

from __future__ import annotations

import json
import re
import tomllib

from tests.deploy.conftest import DEPLOY, INSTALL_DIRS, ROOT, load_docs

DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
INSTRUCTIONS = [
    line.strip()
    for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]


def _all(keyword: str) -> list[str]:
    return [i[len(keyword) + 1 :].strip() for i in INSTRUCTIONS if i.upper().startswith(keyword + " ")]


def test_base_image_and_install() -> None:
    assert all(f.split()[0] == "python:3.11-slim" for f in _all("FROM"))
    assert any(re.search(r"pip install (--\S+ )*\.$", r) for r in _all("RUN"))
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert ">=3.11" in python


def test_entrypoint_and_user() -> None:
    assert json.loads(_all("ENTRYPOINT")[-1]) == ["runnerscale"]
    user = _all("USER")[-1]
    uid = int(user.split(":")[0])
    assert uid != 0
    run_as = set()
    for doc in load_docs(*INSTALL_DIRS):
        if doc.kind in ("Deployment", "Job"):
            pod = doc.obj["spec"]["template"]["spec"]
            if not pod["containers"][0]["image"].startswith("nats:"):
                run_as.add(pod["securityContext"]["runAsUser"])
    assert run_as == {uid}


def test_build_context_has_what_pip_needs() -> None:
    copied = {src for c in _all("COPY") if not c.startswith("--from") for src in c.split()[:-1]}
    assert {"pyproject.toml", "shared", "services"} <= copied
    for path in copied:
        assert (ROOT / path).exists(), path
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= copied
    ignore = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "**" and {"!pyproject.toml", "!shared/**", "!services/**"} <= set(ignore)
