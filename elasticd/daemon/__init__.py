"""The composition root: the daemon, its control plane, failover to a new coordinator, the exporter."""
