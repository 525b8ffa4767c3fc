"""The listener process: one Actions message session per scale set, desired state and job events
on NATS JetStream, leader election between replicas. See README "Listener"."""
