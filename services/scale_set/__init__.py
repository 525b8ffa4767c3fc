"""The scale-set worker: reconciles AutoscalingRunnerSets (README "scale-set worker").

Pure decisions live in :mod:`shared.api.names`, :mod:`services.scale_set.build` and
:mod:`services.scale_set.decide`; :mod:`services.scale_set.reconciler` is the async shell that
reads, decides and writes; :mod:`services.scale_set.worker` declares it for the shared runtime.
"""
