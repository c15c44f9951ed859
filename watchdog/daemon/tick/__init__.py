"""One tick: its read, state, active set, due queue, pre-filter, writes, and its parts."""
