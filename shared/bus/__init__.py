"""The bus: typed messages over NATS JetStream, and leases in NATS KV for horizontal scale.

Import modules, not names, at call sites (``from shared.bus import subjects``), or use the few
names re-exported here.
"""

from shared.bus.bus import Bus, Delivery, Handler, PublishAck, Redeliver
from shared.bus.errors import (
    BusConfigConflict,
    BusError,
    BusUnavailable,
    InvalidResourceName,
    MalformedMessage,
    NotOwner,
    OutboxFull,
    PublishFailed,
    SettingsError,
    UnknownSchemaVersion,
)
from shared.bus.leases import LeaderLease, ShardOwnership, Term
from shared.bus.messages import (
    BusMessage,
    DesiredState,
    JobCompleted,
    JobStarted,
    JobStatistics,
    ResourceChanged,
    ResourceRef,
    RevisionApplied,
    RevisionPublished,
)
from shared.bus.settings import BusSettings, add_bus_arguments, load_settings
from shared.shards import ShardChange

__all__ = [
    "Bus",
    "BusConfigConflict",
    "BusError",
    "BusMessage",
    "BusSettings",
    "BusUnavailable",
    "Delivery",
    "DesiredState",
    "Handler",
    "InvalidResourceName",
    "JobCompleted",
    "JobStarted",
    "JobStatistics",
    "LeaderLease",
    "MalformedMessage",
    "NotOwner",
    "OutboxFull",
    "PublishAck",
    "PublishFailed",
    "Redeliver",
    "ResourceChanged",
    "ResourceRef",
    "RevisionApplied",
    "RevisionPublished",
    "SettingsError",
    "ShardChange",
    "ShardOwnership",
    "Term",
    "UnknownSchemaVersion",
    "add_bus_arguments",
    "load_settings",
]
