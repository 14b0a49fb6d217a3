"""The commit coordinator: conflict rules, the Kafka loop, publication and its CLI."""
