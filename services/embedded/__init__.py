"""The embedded default's doubles and the demo: never imported by production code.

``apiserver`` (Kubernetes API emulator), ``actions_sim`` (Actions service simulator), ``node_sim``
(scheduler + kubelet) and ``demo`` (the supervisor of the whole local stack). Production images do
not need this package; import-linter keeps the production packages from importing it.
"""
