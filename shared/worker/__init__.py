"""The common worker runtime (see README "Worker runtime").

from shared.worker import WorkerSpec, WorkerContext, running_worker, worker_main
"""

from shared.worker.actions_pool import (
    ActionsClientPool,
    ActionsCredentialsUnavailable,
    proxy_url_for,
)
from shared.worker.routing import default_key_of, route_to_controller
from shared.worker.runtime import (
    Setup,
    Task,
    WorkerContext,
    WorkerHandle,
    connect_kube,
    run_worker,
    running_worker,
    start_all,
)
from shared.worker.settings import (
    SettingsError,
    WorkerSettings,
    add_worker_arguments,
    default_replica_id,
    load_worker_settings,
)
from shared.worker.spec import Consume, Owned, Route, WorkerSpec, worker_main

__all__ = [
    "ActionsClientPool",
    "ActionsCredentialsUnavailable",
    "Consume",
    "Owned",
    "Route",
    "SettingsError",
    "Setup",
    "Task",
    "WorkerContext",
    "WorkerHandle",
    "WorkerSettings",
    "WorkerSpec",
    "add_worker_arguments",
    "connect_kube",
    "default_key_of",
    "default_replica_id",
    "load_worker_settings",
    "proxy_url_for",
    "route_to_controller",
    "run_worker",
    "running_worker",
    "start_all",
    "worker_main",
]
