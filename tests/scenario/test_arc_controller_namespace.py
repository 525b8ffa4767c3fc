"""runnerscale installed with another controller namespace than ARC's (README "Switching from
ARC", step 3): the workers cannot see ARC's listeners there, so the dry run names them, to be
deleted by hand before runnerscale starts."""

from __future__ import annotations

import argparse

import pytest

from services.scale_set.adopt_cli import preview
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import Kube, require_crds
from tests.scenario.test_arc_takeover import install_arc_leftovers

pytestmark = pytest.mark.anyio


def dry_run_args(kube_api: KubeApi, controller_namespace: str, namespace: str) -> argparse.Namespace:
    return argparse.Namespace(
        kubeconfig=str(kube_api.kubeconfig),
        kube_context=None,
        controller_namespace=controller_namespace,
        namespace=[namespace],
        listener_image="ghcr.io/example/runnerscale:test",
        exclude_label_propagation_prefix=[],
    )


async def test_dry_run_names_arc_listeners_outside_the_controller_namespace(
    kube: Kube, kube_api: KubeApi, namespace: str, github_secret: str, actions_sim: ActionsSim
) -> None:
    await require_crds(kube)
    await install_arc_leftovers(kube, "arc-0.14.yaml", namespace, actions_sim, github_secret)
    ours = f"{namespace}-rs"  # runnerscale's controller namespace; ARC's listener lives in `namespace`
    text = "\n".join(await preview(dry_run_args(kube_api, ours, namespace)))
    want = (
        f"  stray     AutoscalingListener {namespace}/arc-runner-set-754b578d-listener: ARC's listener outside"
        f" the controller namespace {ours}: runnerscale cannot see it; delete it by hand before starting runnerscale"
    )
    assert want in text, text
    # With ARC's controller namespace as runnerscale's, the workers replace it themselves: no stray line.
    same = "\n".join(await preview(dry_run_args(kube_api, namespace, namespace)))
    assert "stray" not in same, same
    assert f"  delete    AutoscalingListener {namespace}/arc-runner-set-754b578d-listener" in same
