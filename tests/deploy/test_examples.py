"""deploy/examples: what runnerscale's own code makes of them (the API emulator apply is in
test_kubectl.py): the AutoscalingRunnerSets decode and validate as the scale-set worker does, and
each names a GitHub Secret of the examples that the Actions client accepts."""

from __future__ import annotations

import pytest

from shared.actions.auth import AppCredentials, PersonalAccessToken, credentials_from_secret
from shared.api import AutoscalingRunnerSet, decode, validate
from tests.deploy.conftest import EXAMPLES, Doc, find, load_docs

RUNNER_SETS = [d for d in load_docs(EXAMPLES) if d.kind == "AutoscalingRunnerSet"]


@pytest.mark.parametrize("doc", RUNNER_SETS, ids=repr)
def test_runner_set_is_valid(doc: Doc) -> None:
    ars = decode(AutoscalingRunnerSet, doc.obj)
    assert validate(ars) == []
    secret = find(load_docs(EXAMPLES), "Secret", ars.spec.github_config_secret)
    assert secret.namespace == doc.namespace
    credentials_from_secret(secret.obj["stringData"])


def test_both_credential_kinds_and_dind_are_shown() -> None:
    kinds = {type(credentials_from_secret(d.obj["stringData"])) for d in load_docs(EXAMPLES) if d.kind == "Secret"}
    assert kinds == {PersonalAccessToken, AppCredentials}
    dind = [
        d
        for d in RUNNER_SETS
        if any(c["name"] == "dind" for c in d.obj["spec"]["template"]["spec"].get("initContainers", []))
    ]
    assert dind and dind[0].obj["spec"]["githubConfigSecret"] == "github-app-secret"
    names = {d.namespace for d in load_docs(EXAMPLES) if d.kind != "Namespace"}
    assert names == {find(load_docs(EXAMPLES), "Namespace", "arc-runners").name}
