"""`agent-watchdog exec`: any command, in any language, as one watched run.

- supervisor: the whole of it (register, attest, start, watch, stop, end, exit status);
- spawn: fork + exec of the command, held at a gate until its cgroup and attestation are in place;
- reaper: child subreaper, reaping by pid, the tree's members and how they are signalled;
- cgroup: the run's own cgroup v2 (direct, delegated, or a systemd user scope);
- environment: what the command is given (the run, the store, the socket, OTLP).
"""

from watchdog.gateways.exec.supervisor import ExecOptions, run_exec

__all__ = ["ExecOptions", "run_exec"]
