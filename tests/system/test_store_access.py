"""Misconfiguration is loud, outages are absorbed (issue 11, point 5).

A store that answers but cannot be used by the agent (read-only for its user, never
migrated, refusing its credentials) raises StoreMisconfigured at the run's first contact,
one line with the URL (password masked) and the fix. A store that is merely unreachable
stays an outage: buffered, warned once. And the store `db upgrade` makes under the unit's
UMask=0007 is writable by an agent in the store's group (real users, real files).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from attest_support import LocalUsers, foreign_python, short_dir
from watchdog import StoreMisconfigured, Watchdog

CLI = str(Path(sys.executable).with_name("agent-watchdog"))

# A short agent run as another local user: prints OK, or the exception's class and message.
AGENT = """
import sys
from watchdog import Watchdog
try:
    wd = Watchdog(sys.argv[1], attest_socket="")
    with wd.run(agent="perm-check") as run:
        run.step(cost_eur=0.01)
    wd.close()
    print("OK", wd.buffered, wd.rejected_events)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.fixture(scope="module")
def users():
    made = LocalUsers()
    group = f"awst{uuid.uuid4().hex[:6]}"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        member, outsider = made.add("member"), made.add("outsider")
        subprocess.run(["usermod", "-aG", group, member], check=True, capture_output=True)
        yield {"group": group, "member": member, "outsider": outsider}
    finally:
        made.close()
        subprocess.run(["groupdel", group], capture_output=True)


def login(user: str) -> dict:
    """subprocess keywords for a process of `user` with its own groups (user= alone keeps root's)."""
    pw = pwd.getpwnam(user)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(user, pw.pw_gid)}


def as_user(user: str, url: str) -> str:
    exe, env = foreign_python()
    done = subprocess.run([exe, "-c", AGENT, url], env=env, cwd="/tmp", capture_output=True, text=True,
                          timeout=120, **login(user))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def store_dir(group: str) -> Path:
    """The README's store/ directory: setgid + sticky, group-writable for the store's group."""
    folder = short_dir("awst")
    folder.chmod(0o711)
    store = folder / "store"
    store.mkdir()
    shutil.chown(store, group=group)
    store.chmod(0o3770)
    return store


def db_upgrade(url: str, umask: int = 0o007) -> None:
    done = subprocess.run([CLI, "db", "upgrade", "--db", url], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.umask(umask),
                          env={k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG")})
    assert done.returncode == 0, done.stderr


def test_db_upgrade_under_umask_0007_makes_a_store_the_agents_group_can_write(users):
    store = store_dir(users["group"])
    db = store / "runs.db"
    url = f"sqlite:///{db}"
    db_upgrade(url)
    st = db.stat()
    assert stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)  # SQLite alone would give 0644 - 0007 = 0640
    assert grp.getgrgid(st.st_gid).gr_name == users["group"]  # the setgid directory's group
    assert as_user(users["member"], url) == "OK 0 0"
    for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):  # made by the agent's connection: the file's mode
        if f.exists():
            assert stat.S_IMODE(f.stat().st_mode) & 0o007 == 0, (f, oct(f.stat().st_mode))
    # The sticky bit: a group member can write the store but not rename or delete it.
    exe, env = foreign_python()
    moved = subprocess.run([exe, "-c", f"import os; os.rename({str(db)!r}, {str(db) + '.x'!r})"],
                           env=env, cwd="/tmp", capture_output=True, text=True, timeout=60, **login(users["member"]))
    assert moved.returncode != 0 and "PermissionError" in moved.stderr, moved.stderr
    assert db.exists()
    shutil.rmtree(store.parent)


def test_db_upgrade_never_widens_a_file_beyond_0660(tmp_path):
    db = tmp_path / "runs.db"
    url = f"sqlite:///{db}"
    db_upgrade(url, umask=0o000)  # SQLite would make it 0644: world-readable
    assert stat.S_IMODE(db.stat().st_mode) == 0o660


def test_a_read_only_sqlite_store_raises_at_the_first_run_with_the_fix(users):
    store = store_dir(users["group"])
    db = store / "runs.db"
    url = f"sqlite:///{db}"
    db_upgrade(url)
    out = as_user(users["outsider"], url)  # not in the store's group: cannot even open it for writing
    assert out.startswith("StoreMisconfigured agent-watchdog: the store at "), out
    assert url in out and f"user {users['outsider']}" in out and "chmod 0660" in out, out
    assert len(out.splitlines()) == 1, out
    # A file readable but not writable (a 0640 store, the bug's case) says the same.
    store.chmod(0o3775)
    db.chmod(0o644)
    out = as_user(users["outsider"], url)
    assert out.startswith("StoreMisconfigured") and "readonly database" in out and "group-writable" in out, out
    shutil.rmtree(store.parent)


# --- PostgreSQL -------------------------------------------------------------------------------


@contextmanager
def login_role(pg_migrated: str, prefix: str, options: str = "", password: str | None = None):
    """(admin engine, role name, URL of the store as that role): a real login role, dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(pg_migrated, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{name}" LOGIN {options}'))
    base, db = pg_migrated.rsplit("/", 1)
    auth = f"{name}:{password}" if password else name
    try:
        yield admin, name, f"postgresql+psycopg://{auth}@{base.split('@', 1)[1]}/{db}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}'"))
            conn.execute(text(f'DROP ROLE "{name}"'))
        admin.dispose()


@pytest.fixture
def pg_role(pg_migrated):
    """A login role with no grant at all on the store's tables (trust auth: no password)."""
    with login_role(pg_migrated, "aw_nogrant", password="s3cret-pw") as (_admin, _name, url):
        yield url


def first_run(url: str) -> StoreMisconfigured:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no outage warning: it is not an outage
        wd = Watchdog(url, attest_socket="")
        try:
            with pytest.raises(StoreMisconfigured) as caught:
                with wd.run(agent="a") as run:
                    run.step(cost_eur=0.01)
            assert wd.buffered == 0
        finally:
            wd.close()
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and "s3cret" not in message, message
    return caught.value


def test_a_postgresql_role_without_the_grants_raises_naming_the_roles_script(pg_role):
    message = str(first_run(pg_role))
    assert "permission denied" in message and "sql/postgres-roles.sql" in message, message
    assert pg_role.split(":s3cret", 1)[0].replace("+psycopg", "") in message.replace("+psycopg", "")
    assert ":***@" in message, message


def test_a_role_the_server_does_not_know_raises_that_it_refuses_the_credentials(pg_migrated):
    base, db = pg_migrated.rsplit("/", 1)
    url = f"postgresql+psycopg://aw_nobody_{uuid.uuid4().hex[:6]}:s3cret@{base.split('@', 1)[1]}/{db}"
    message = str(first_run(url))
    assert "refuses the credentials" in message and "does not exist" in message and ":***@" in message, message


def test_an_unmigrated_postgresql_database_raises_run_db_upgrade(pg_server_url):
    name = f"aw_empty_{uuid.uuid4().hex[:6]}"
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = pg_server_url.rsplit("/", 1)[0] + f"/{name}"
        message = str(first_run(url))
        assert "has no tables" in message and "agent-watchdog db upgrade --db" in message, message
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_an_unreachable_store_at_start_is_an_outage_buffered_not_raised(pg_migrated):
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: connection refused
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wd = Watchdog(url, attest_socket="")
        with wd.run(agent="a") as run:
            run.step(cost_eur=0.01)
            run.step(cost_eur=0.01)
    outage = [w for w in caught if issubclass(w.category, RuntimeWarning) and "unreachable" in str(w.message)]
    assert len(outage) == 1, [str(w.message) for w in caught]
    assert wd.buffered == 4  # start, two steps, end: kept for when the store is back
    wd._buffer.clear()
    wd.close()


def test_a_store_refused_after_the_first_write_is_an_outage(pg_migrated):
    """Mid-run the same refusal is an outage: the run goes on, its records are kept."""
    with login_role(pg_migrated, "aw_gone", "SUPERUSER") as (admin, name, url):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wd = Watchdog(url, attest_socket="")
            with wd.run(agent="a", guards=False) as run:
                run.step(cost_eur=0.01)
                with admin.connect() as conn:  # the role is gone mid-run (and its sessions with it)
                    conn.execute(text(f'ALTER ROLE "{name}" NOLOGIN'))
                    conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                      f"WHERE usename = '{name}'"))
                run.step(cost_eur=0.01)
        assert wd.buffered >= 2  # the step and the end, kept
        warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(warned) == 1 and "buffering" in warned[0], warned
        wd._buffer.clear()
        wd.close()


def test_the_sdk_never_creates_a_sqlite_file_at_a_mistyped_path(tmp_path):
    """A typo in the store's path is the developer's to fix: wd.run() says so, and no empty
    file is left behind for the next command to find."""
    from watchdog import Watchdog
    from watchdog.errors import StoreMisconfigured

    path = tmp_path / "typo" / "runs.db"
    path.parent.mkdir()
    url = f"sqlite:///{path}"
    wd = Watchdog(url)
    try:
        with pytest.raises(StoreMisconfigured) as caught:
            with wd.run(agent="a") as run:
                run.step(cost_eur=0.01)
    finally:
        wd.close()
    assert str(caught.value) == (f"agent-watchdog: no store at {path}: create it with "
                                 f"`agent-watchdog db upgrade --db {url}`, or check the URL")
    assert list(path.parent.iterdir()) == []
