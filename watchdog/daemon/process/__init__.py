"""The daemon process: service, reload, the jobs' loop, its files, metrics, status."""
