"""The runner-set worker: reconciles EphemeralRunnerSets (see README "runner-set worker").

Pure decisions live in :mod:`services.runner_set.decide` and :mod:`services.runner_set.failures`
(with the worker's settings, ``FailurePolicy``); the async shell is
:mod:`services.runner_set.reconciler`; :mod:`services.runner_set.worker` declares it for the
shared runtime.
"""
