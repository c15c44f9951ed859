"""The PostgreSQL steps of docs/howto/several-hosts.md and the roles script, as written (issue 19,
item 7): the page's commands run against the real server (only `sudo -u postgres` becomes `-h -U
postgres`, and the names get a suffix so that tests do not share roles), and the roles
script that `agent-watchdog files roles` prints is the one they run."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from pg_support import PG_ADMIN_URL

REPO = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "agent-watchdog")

pytestmark = pytest.mark.postgres


def _readme_pg_block() -> list[str]:
    text = (REPO / "docs" / "howto" / "several-hosts.md").read_text()
    block = re.search(r"```sh\n(sudo -u postgres createuser agent_watchdog .*?)```", text, re.S).group(1)
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_the_readmes_postgresql_steps_run_as_written():
    admin = make_url(PG_ADMIN_URL)
    host, port = admin.host or "127.0.0.1", str(admin.port or 5432)
    tag = uuid.uuid4().hex[:6]
    names = {"agent_watchdog_agents": f"aw_agents_{tag}", "agent_alice": f"aw_alice_{tag}",
             "agent_watchdog": f"aw_owner_{tag}"}
    db = names["agent_watchdog"]
    lines = _readme_pg_block()
    assert len(lines) == 4, lines
    try:
        for line in lines:
            cmd = line
            for old, new in names.items():  # longest first: agent_watchdog_agents before agent_watchdog
                cmd = re.sub(rf"\b{old}\b", new, cmd)
            cmd = cmd.replace("@db/", f"@{host}:{port}/")
            cmd = re.sub(r"(^|&& )sudo -u postgres (\w+)", rf"\1\2 -h {host} -p {port} -U postgres", cmd)
            cmd = re.sub(r"^sudo -u agent-watchdog /opt/agent-watchdog/venv/bin/agent-watchdog", EXE, cmd)
            assert "sudo" not in cmd, cmd
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=REPO, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, (cmd, done.stdout, done.stderr)
        # The agents' login role writes a run through the SDK, as the README's last line says.
        code = ("from watchdog import Watchdog\nimport sys\nwd = Watchdog(sys.argv[1])\n"
                "with wd.run(agent='bot', kill_mode='cooperative') as r:\n    r.step(cost_eur=0.0)\nprint('ok')")
        url = f"postgresql+psycopg://{names['agent_alice']}@{host}:{port}/{db}"
        ran = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stderr
        # `files roles` prints the very script the README runs.
        printed = subprocess.run([EXE, "files", "roles"], capture_output=True, text=True, timeout=60)
        assert printed.stdout == (REPO / "sql" / "postgres-roles.sql").read_text()
    finally:
        with psycopg.connect(f"host={host} port={port} user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            for role in (names["agent_alice"], names["agent_watchdog_agents"], names["agent_watchdog"]):
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')
