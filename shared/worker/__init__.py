"""The common worker runtime (see README "Worker runtime").

from shared.worker import WorkerContext, running_worker, worker_main
"""

from shared.worker.actions_pool import (
    CONFIG_MAPS,
    ActionsClientPool,
    ActionsCredentialsUnavailable,
    ConfigMap,
    proxy_url_for,
)
from shared.worker.routing import default_key_of, route_to_controller
from shared.worker.runtime import (
    Setup,
    WorkerContext,
    WorkerHandle,
    connect_kube,
    run_worker,
    running_worker,
    worker_main,
)
from shared.worker.settings import (
    SettingsError,
    WorkerSettings,
    add_worker_arguments,
    default_replica_id,
    load_worker_settings,
    parse_listen_addr,
    validate_worker_settings,
)

__all__ = [
    "CONFIG_MAPS",
    "ActionsClientPool",
    "ActionsCredentialsUnavailable",
    "ConfigMap",
    "SettingsError",
    "Setup",
    "WorkerContext",
    "WorkerHandle",
    "WorkerSettings",
    "add_worker_arguments",
    "connect_kube",
    "default_key_of",
    "default_replica_id",
    "load_worker_settings",
    "parse_listen_addr",
    "proxy_url_for",
    "route_to_controller",
    "run_worker",
    "running_worker",
    "validate_worker_settings",
    "worker_main",
]
