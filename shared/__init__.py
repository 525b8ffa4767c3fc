"""runnerscale's common library: API types, kube access, semantic comparison, bus, Actions client."""
