"""Who judges what: the host and store leases, the leader's duties, the shards."""
