"""The ``runner`` worker: reconciles EphemeralRunners (JIT config Secret, runner pod, status).

See README "runner worker". Pure decisions live in :mod:`services.runner.build`,
:mod:`services.runner.decide` and :mod:`services.runner.jobs`; the async shell is
:mod:`services.runner.reconciler` and :mod:`services.runner.worker`.
"""
