"""What the daemon knows and believes of a run: its own evidence, never the row's claim."""
