"""The node simulator (``runnerscale node-sim``): scheduler + kubelet for the API emulator.

Public API: ``services.embedded.node_sim.node.NodeSim`` / ``NodeSimConfig`` (see README "Node simulator").
Kept import-free so that ``python -m services.embedded.node_sim.launch`` (the exec shim every process pod
goes through) starts fast.
"""
