"""The ``runner`` worker: reconciles EphemeralRunners (JIT config Secret, runner pod, status).

See README "runner worker". Pure decisions live in :mod:`services.runner.build`,
:mod:`services.runner.decide` (with the worker's settings) and :mod:`services.runner.jobs`; the
async shell is :mod:`services.runner.reconciler`; :mod:`services.runner.worker` declares it for
the shared runtime.
"""
