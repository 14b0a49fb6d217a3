"""The Kafka edge: the per-partition decide loop, recovery from the commits topic, the daemon, topics and ACLs."""
