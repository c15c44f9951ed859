"""The daemon's own directories, created when missing (issue 19: defaults that work everywhere).

`[daemon] state_dir` (its key, lease lock, state file) is private to the daemon's user
(0700); the socket's directory is reachable by the agents' users (0755: the socket itself
is 0666, and the kernel tells the daemon who connects). Existing directories are left as
they are: systemd's StateDirectory= / RuntimeDirectory= and an operator's own choices win.
"""

from __future__ import annotations

import os

from watchdog.core.config import DaemonConfig
from watchdog.errors import ConfigError


def ensure(daemon: DaemonConfig) -> None:
    """Create state_dir, the key file's directory and the socket's directory if missing;
    one line naming the key when that is impossible."""
    for key, path, mode in (("state_dir", daemon.state_dir, 0o700),
                            ("key_file", os.path.dirname(daemon.key_file), 0o700),
                            ("socket", os.path.dirname(daemon.socket), 0o755)):
        if not path or os.path.isdir(path):
            continue
        try:
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)  # whatever the umask said
        except OSError as exc:
            raise ConfigError(f"[daemon] {key}: cannot create {path} ({exc.strerror}); create it for the daemon's "
                              f"user or set [daemon] {key} to a directory it can write") from None
