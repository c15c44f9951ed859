"""A scratch root: run an operator's `sudo ...` steps as written, without touching this machine.

`ScratchRoot(base).run(steps)` runs shell snippets in private mount and pid namespaces
(`unshare`, we are root) where:

- /etc is a copy kept in BASE/root/etc, so `useradd` writes BASE/root/etc/passwd; the copy
  has none of this machine's own agent-watchdog install (/etc/agent-watchdog, its users);
- /opt, /var/lib and /usr/local/bin show this machine's entries (bind mounts), but
  anything created there lands in BASE/root/opt, BASE/root/var/lib, ... instead;
- /run is an empty tmpfs, /proc shows only the namespace's processes;
- `sudo` and `systemctl` are the stand-ins of tests/scratch_root/ (first on the
  PATH, in /usr/local/bin): sudo is usually not installed here and systemd does not
  run; the systemctl stand-in does what systemd does at a start (see its docstring).

Files persist in BASE/root between runs; processes do not: everything started in a
run is killed when its last snippet returns (the pid namespace's init exits).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SHIMS = Path(__file__).resolve().parent / "scratch_root"
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SETUP = r"""
set -euo pipefail
R="$1"
shadow() {  # $1 shows this machine's entries; new ones are created in $R$1
    local dir="$1" upper="$R$1" entry name
    mkdir -p "$upper"
    for entry in "$dir"/* "$dir"/.[!.]*; do
        [[ -e "$entry" || -L "$entry" ]] || continue
        name="${entry##*/}"
        # Never this project's own host directories (a daemon once run on this machine left
        # /var/lib/agent-watchdog): the steps must create theirs as a new machine would.
        [[ "$name" == agent-watchdog ]] && continue
        if [[ -L "$entry" ]]; then
            [[ -e "$upper/$name" || -L "$upper/$name" ]] || cp -a "$entry" "$upper/$name"
        elif [[ -d "$entry" ]]; then
            mkdir -p "$upper/$name" && mount --rbind "$entry" "$upper/$name"
        else
            [[ -e "$upper/$name" ]] || touch "$upper/$name"
            mount --bind "$entry" "$upper/$name"
        fi
    done
    mount --rbind "$upper" "$dir"
}
if [[ ! -d "$R/etc" ]]; then
    cp -a /etc "$R/etc"
    # Not this machine's own install either (its config, its users): the steps make theirs.
    rm -rf "$R/etc/agent-watchdog"
    for f in passwd group shadow gshadow; do
        [[ -f "$R/etc/$f" ]] && sed -i -E '/^(agent-watchdog|agent-watchdog-store|agents):/d' "$R/etc/$f"
    done
fi
mount --bind "$R/etc" /etc
shadow /opt
shadow /var/lib
shadow /usr/local/bin
for shim in sudo systemctl; do
    rm -f "/usr/local/bin/$shim" 2>/dev/null || umount "/usr/local/bin/$shim"
    rm -f "/usr/local/bin/$shim"
    cp "$2/$shim" "/usr/local/bin/$shim" && chmod 0755 "/usr/local/bin/$shim"
done
mount -t tmpfs -o mode=0755 tmpfs /run
shift 2
cd "$1"; shift
status=0
for step in "$@"; do
    echo "+++ $step"
    bash -euo pipefail "$step" || { status=$?; echo "+++ $step failed with exit status $status"; break; }
done
exit "$status"
"""


class ScratchRoot:
    def __init__(self, base: Path):
        self.base = base
        self.root = base / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)  # `sudo -u USER` keeps the cwd (the checkout copy in BASE): USER must reach it
        self._n = 0

    def path(self, inside: str) -> Path:
        """Where a path of the scratch root (/etc/..., /var/lib/..., /opt/...) is on this machine."""
        return self.root / inside.lstrip("/")

    def run(self, cwd: Path, steps: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
        """Run each snippet with `bash -euo pipefail` in cwd, in order, stopping at the first failure."""
        files = []
        for text in steps:
            self._n += 1
            f = self.base / f"step-{self._n}.sh"
            f.write_text(text if text.endswith("\n") else text + "\n")
            files.append(str(f))
        env = {"PATH": SECURE_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "LANG": "C.UTF-8",
               "TERM": "dumb", "SHELL": "/bin/bash"}
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
             "bash", "-c", SETUP, "setup", str(self.root), str(SHIMS), str(cwd), *files],
            capture_output=True, text=True, errors="replace", timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)


def available() -> str | None:
    """Why a scratch root cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (mount and pid namespaces)"
    for tool in ("unshare", "setpriv", "useradd"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None
