"""Wire contract: Delta actions, Avro messages and shared exceptions."""
