"""Real stores for every test: a SQLite file and a PostgreSQL database.

PostgreSQL: a fresh database per test session on $AGENT_WATCHDOG_TEST_PG's
server (default postgres@127.0.0.1:5432), emptied between tests. If the server
is unreachable the PostgreSQL tests fail (they are never silently skipped).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid

# Hermetic defaults: as root (CI) the daemon's default state directory and socket are the
# host's /var/lib/agent-watchdog and /run/agent-watchdog (watchdog.core.paths). A test that
# forgets to name its own gets a directory of this test session instead, exactly as systemd
# would hand one over, never the host's (and tests/hermetic.py fails one that still reaches them).
_SESSION_DIRS = tempfile.mkdtemp(prefix="aw-test-dirs-")
os.environ.setdefault("STATE_DIRECTORY", os.path.join(_SESSION_DIRS, "state"))
os.environ.setdefault("RUNTIME_DIRECTORY", os.path.join(_SESSION_DIRS, "run"))
for _d in (os.environ["STATE_DIRECTORY"], os.environ["RUNTIME_DIRECTORY"]):
    os.makedirs(_d, mode=0o700, exist_ok=True)
# An agent's own default is the host's /run/agent-watchdog/attest.sock (watchdog.core.paths): a run
# with kill_mode "process" would attest to a daemon running on this machine. It looks where a
# daemon of this session listens by default instead (tests that start one still name theirs).
os.environ.setdefault("AGENT_WATCHDOG_SOCKET", os.path.join(os.environ["RUNTIME_DIRECTORY"], "attest.sock"))
# LiteLLM, imported in-process by the callback's tests, fetches its model cost map from GitHub in
# a background thread, and retries: hermetic tests have no network, and a retry that fires while
# a later unit test of the same worker runs fails that test in the unit guard (seen). Its own map.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
atexit.register(shutil.rmtree, _SESSION_DIRS, True)

# Imported only now: the package resolves its default paths when it is imported (Config's
# DaemonConfig() default), so the directories above must be set first.
import pytest  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from pg_support import BACKENDS, PG_ADMIN_URL, empty_pg  # noqa: E402
from watchdog.store import access  # noqa: E402
from watchdog.store.engine import make_engine  # noqa: E402

# noskip: under CI=true a skip is a failure; hermetic: a test touching the host's own
# agent-watchdog paths (/var/lib/agent-watchdog, ...) fails.
pytest_plugins = ("noskip", "hermetic")


@pytest.fixture(scope="session")
def pg_server_url():
    """URL of a fresh PostgreSQL database for this session; dropped afterwards."""
    name = f"aw_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is unreachable, the PostgreSQL tests cannot run: {exc}")
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def pg_migrated(pg_server_url):
    engine = make_engine(pg_server_url)
    access.upgrade(engine)
    engine.dispose()
    return pg_server_url


@pytest.fixture(scope="session")
def _migrated_sqlite_file(tmp_path_factory):
    """One SQLite file migrated to head by `access.upgrade`, made once per test process: the per-test
    stores are byte copies of it (an upgrade is ~0.3 s of fsyncs, times ~700 SQLite tests). Its last
    connection closed, so the WAL is checkpointed into the file and gone: the file alone is the store
    (its WAL journal mode is in the file's header and comes along)."""
    path = tmp_path_factory.mktemp("sqlite-head") / "runs.db"
    engine = make_engine(f"sqlite:///{path}")
    access.upgrade(engine)
    engine.dispose()
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert leftovers == [], f"the migrated SQLite file is not self-contained: {leftovers}"
    return path.read_bytes()


def _fresh_sqlite_store(request, path) -> str:
    """A migrated, empty SQLite store of the test's own at path (a new file, as SQLite creates it:
    mode 0644 less the umask), its URL."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(request.getfixturevalue("_migrated_sqlite_file"))
    return f"sqlite:///{path}"


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    """A migrated, empty store on each backend."""
    if request.param == "sqlite":
        yield _fresh_sqlite_store(request, tmp_path / "runs.db")
    else:
        url = request.getfixturevalue("pg_migrated")
        empty_pg(url)
        yield url


@pytest.fixture
def wd(db_url):
    """The SDK on the test's store (files that need other options define their own)."""
    from watchdog import Watchdog

    w = Watchdog(db_url)
    yield w
    w.close()


@pytest.fixture
def engine(db_url):
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_url(request, tmp_path):
    return _fresh_sqlite_store(request, tmp_path / "runs.db")


# --- shared fixtures: real alert sinks and real agent processes -----------------


@pytest.fixture
def smtp():
    """A local SMTP server (aiosmtpd) on 127.0.0.1 that records the mails it gets."""
    from alertsinks import SmtpSink

    with SmtpSink() as sink:
        yield sink


@pytest.fixture
def http():
    """A local HTTP server on 127.0.0.1 that records JSON posts (apprise json://)."""
    from alertsinks import HttpSink

    with HttpSink() as sink:
        yield sink


@pytest.fixture
def procs(tmp_path):
    """Agent child processes, all killed at teardown."""
    from agent_procs import AgentProcs

    p = AgentProcs(tmp_path)
    yield p
    p.close()


@pytest.fixture
def sealer():
    """The daemon's sealing key for tests that drive a Ticker or the outbox directly."""
    from watchdog.core.seal import Sealer
    from watchdog.daemon.stops.killer import Killer

    return Sealer(os.urandom(32), Killer().host)


@pytest.fixture
def attest(monkeypatch):
    """attest(url): the daemon's attestation socket on a store (its own key), started; agents
    started afterwards find it through $AGENT_WATCHDOG_SOCKET, as in production."""
    from attest_support import Attestor

    made = []

    def start(url):
        a = Attestor(url).start()
        made.append(a)
        monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", a.socket)
        return a

    yield start
    for a in made:
        a.close()


# --- the order files are handed out in ----------------------------------------------------------

# CI runs `-n 3 --dist loadfile`: xdist hands whole files to its three workers in collection order.
# The long files go first so that the last file a worker gets is short; were test_readme.py (a
# fresh venv) last, one worker would run it alone while the other idles. Heaviest first, as far as
# their real processes, venvs and wheels say (a file not named is ordered by its kind: system,
# chaos and integrations, then store, then unit, whose small files fill the end).
HEAVY_FIRST = (  # by their summed test time in a whole run (junit, 2026-12-08), the heaviest first
    "system/test_coding_clis.py", "system/test_exec.py", "system/test_develop_page.py", "system/test_readme.py",
    "system/test_mcp_proxy.py", "chaos/test_chaos.py", "system/test_failsafe.py", "system/test_status.py",
    "system/test_pause.py", "system/test_clock_jump.py", "system/test_cli_messages.py", "system/test_heard.py",
    "system/test_cluster.py", "system/test_docs.py", "system/test_gateways_pg.py", "system/test_exec_status.py",
    "system/test_hook_subagents.py", "system/test_ladder.py", "system/test_daemon.py", "system/test_packaging.py",
    "system/test_demo.py", "system/test_security.py", "system/test_evidence_mac.py",
)
KIND_ORDER = {"system": 0, "chaos": 0, "integrations": 0, "store": 1, "unit": 2}
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def file_rank(path: str) -> tuple[int, int]:
    """Where a test file goes in the run: the named heavy ones in their order, then by kind."""
    rel = os.path.relpath(path, _TESTS_DIR).replace(os.sep, "/")
    if rel in HEAVY_FIRST:
        return (0, HEAVY_FIRST.index(rel))
    return (1, KIND_ORDER.get(rel.split("/", 1)[0], 0))


def pytest_collection_modifyitems(items):
    # A stable sort by file: each file's tests stay together and in their own order.
    items.sort(key=lambda item: file_rank(str(item.path)))
