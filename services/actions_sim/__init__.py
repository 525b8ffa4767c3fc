"""A local, stateful simulator of GitHub's Actions runner scale set service (see docs/actions-sim.md)."""
