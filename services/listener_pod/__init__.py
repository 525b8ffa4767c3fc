"""The listener-pod worker (``runnerscale listener-pod``): reconciles AutoscalingListeners into a
service account, role, role binding, listener config Secret and the listener pod (README "listener-pod worker").

Pure parts: :mod:`services.listener_pod.build` (what should exist) and
:mod:`services.listener_pod.decide` (drift, pod state, restart backoff, settings); the async
shell: :mod:`services.listener_pod.reconciler`; the declaration: :mod:`services.listener_pod.worker`.
"""
