"""Alert delivery: the outbox, one lane per target, apprise, what was delivered."""
