"""The commit coordinator: the rules (pure), the Kafka edge, the _delta_log edge and the tooling around them."""
