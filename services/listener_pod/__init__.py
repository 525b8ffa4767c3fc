"""The listener-pod worker (``runnerscale listener-pod``): reconciles AutoscalingListeners into a
service account, role, role binding, listener config Secret and the listener pod (README "listener-pod worker").

Pure decisions: :mod:`services.listener_pod.desired`; the async shell:
:mod:`services.listener_pod.reconciler`; the process: :mod:`services.listener_pod.worker`.
"""
