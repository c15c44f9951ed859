"""Stopping runs: compose a stop, the ladder, the killer, attestation, process trees."""
