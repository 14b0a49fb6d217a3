"""Writers: the batch client that stages data and proposes commits."""
