"""The pure rules behind exec: cgroup names and the mount, the command's environment, the seal
of an attested cgroup (the reaper and the guarded cgroup kill, with real processes:
tests/system/test_exec_reaper.py)."""

from __future__ import annotations

import os
import textwrap

import pytest

from watchdog.core import cgroups as rules
from watchdog.core.seal import Sealer
from watchdog.gateways.exec.environment import command_env, otlp_endpoint, otlp_listen

RUN = "0123456789abcdef0123456789abcdef"
HYBRID = textwrap.dedent("""\
    25 1 0:23 / /sys rw,nosuid - sysfs sysfs rw
    31 25 0:27 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
    42 31 0:39 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
""")


def test_the_cgroup2_mount_is_found_in_mountinfo_whatever_the_layout():
    assert rules.cgroup2_mount(HYBRID) == "/sys/fs/cgroup/unified"
    assert rules.cgroup2_mount("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") == "/sys/fs/cgroup"
    assert rules.cgroup2_mount("30 1 0:26 / /mnt/my\\040cg rw shared:1 - cgroup2 none rw\n") == "/mnt/my cg"
    assert rules.cgroup2_mount("42 31 0:39 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None
    assert rules.cgroup2_mount("garbage\n\n") is None


def test_the_unified_path_of_a_process():
    assert rules.unified_path("4:memory:/x\n0::/user.slice/a.scope\n") == "/user.slice/a.scope"
    assert rules.unified_path("0::/\n") == "/"
    assert rules.unified_path("4:memory:/x\n") is None


@pytest.mark.parametrize("path, ok", [
    (f"/sys/fs/cgroup/unified/agent-watchdog-run-{RUN}", True),
    (f"/sys/fs/cgroup/unified/user.slice/agent-watchdog-run-{RUN}.scope", True),
    ("/sys/fs/cgroup/unified/system.slice", False),  # not the run's name
    (f"/sys/fs/cgroup/unified/agent-watchdog-run-{RUN[:-1]}x", False),  # another run's
    (f"/sys/fs/cgroup/agent-watchdog-run-{RUN}", False),  # outside the cgroup2 mount
    (f"/sys/fs/cgroup/unified/../memory/agent-watchdog-run-{RUN}", False),  # '..'
    (f"agent-watchdog-run-{RUN}", False),  # relative
    ("/sys/fs/cgroup/unified", False),  # the root itself
    ("", False),
])
def test_only_a_cgroup_named_for_the_run_under_the_mount_can_be_its_cgroup(path, ok):
    err = rules.run_cgroup_error(path, RUN, "/sys/fs/cgroup/unified")
    assert (err is None) == ok, err
    assert rules.run_cgroup_error(path, RUN, None) is not None  # no cgroup2 on the host: never


def test_the_seal_covers_the_cgroup():
    s = Sealer(os.urandom(32), "h")
    mac = s.identity(RUN, "h", 10, 1.5, 1000, "cgroup", "/cg/agent-watchdog-run-x")
    assert s.identity_ok(mac, RUN, "h", 10, 1.5, 1000, "cgroup", "/cg/agent-watchdog-run-x")
    assert not s.identity_ok(mac, RUN, "h", 10, 1.5, 1000, "cgroup", "/cg/system.slice")
    assert not s.identity_ok(mac, RUN, "h", 10, 1.5, 1000, "cgroup", None)
    old = s.identity(RUN, "h", 10, 1.5, 1000, "tree")
    assert old == s.identity(RUN, "h", 10, 1.5, 1000, "tree", None)  # attestations without one are unchanged
    assert not s.identity_ok(old, RUN, "h", 10, 1.5, 1000, "tree", "/cg/agent-watchdog-run-x")


def test_the_environment_names_the_run_and_turns_otlp_on_only_when_the_daemon_listens():
    base = {"PATH": "/bin", "OTEL_RESOURCE_ATTRIBUTES": "service.name=bot,agent_watchdog.run_id=forged"}
    env = command_env(base, run_id=RUN, db_url="sqlite:///r.db", socket="/s", config_path=None)
    assert (env["AGENT_WATCHDOG_RUN"], env["AGENT_WATCHDOG_DB"], env["AGENT_WATCHDOG_SOCKET"]) == (RUN, "sqlite:///r.db", "/s")
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" not in env and "AGENT_WATCHDOG_CONFIG" not in env
    env = command_env({**base, "OTEL_BSP_SCHEDULE_DELAY": "1000"}, run_id=RUN, db_url="u", socket="/s",
                      config_path="/etc/wd.toml", otlp_listen_at="0.0.0.0:4318")
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://127.0.0.1:4318/v1/traces"
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_BSP_SCHEDULE_DELAY"] == "1000"  # the agent's own choice stands
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == f"service.name=bot,agent_watchdog.run_id={RUN}"
    assert env["AGENT_WATCHDOG_CONFIG"] == "/etc/wd.toml"
    assert command_env({}, run_id=RUN, db_url="u", socket="/s", config_path=None,
                       otlp_listen_at="127.0.0.1:4318")["OTEL_BSP_SCHEDULE_DELAY"] == "200"
    assert otlp_endpoint("[::]:4318") == "http://[::1]:4318/v1/traces"
    assert otlp_endpoint("nonsense") is None and otlp_endpoint("") is None


def test_otlp_listen_is_read_defensively_from_any_config_shape():
    class Otlp:
        listen = "127.0.0.1:4318"

    class WithOtlp:
        otlp = Otlp()

    assert otlp_listen(WithOtlp()) == "127.0.0.1:4318"
    assert otlp_listen(object()) == ""
    assert otlp_listen(type("C", (), {"otlp": {"listen": "127.0.0.1:1"}})()) == "127.0.0.1:1"


def test_the_runs_token_goes_to_the_traces_exporter_only_merged_with_the_commands_headers():
    from watchdog.gateways.exec.environment import otlp_env

    env = otlp_env({"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme,Authorization=Bearer%20theirs"}, run_id="r1",
                   endpoint="http://127.0.0.1:4318/v1/traces", token="aw1.r1.mac")
    assert env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] == "x-tenant=acme,Authorization=Bearer%20aw1.r1.mac"
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in env  # the command's other exporters keep their own
    assert env["OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"] == "process"
    assert otlp_env({"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "host"}, run_id="r1", endpoint="e",
                    token=None).keys() == {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                           "OTEL_BSP_SCHEDULE_DELAY", "OTEL_RESOURCE_ATTRIBUTES"}


def test_a_runs_otlp_token_names_its_run_and_no_other():
    from watchdog.core.seal import Sealer

    s = Sealer(b"k" * 32)
    token = s.otlp_token("ab" * 16)
    assert s.otlp_token_ok(token) == "ab" * 16
    forged = token.replace("ab" * 16, "cd" * 16)
    assert s.otlp_token_ok(forged) is None and Sealer(b"j" * 32).otlp_token_ok(token) is None
    assert s.otlp_token_ok("aw1.x") is None


def test_the_runs_token_goes_to_the_logs_exporter_too_unless_its_logs_go_elsewhere():
    """A coding CLI's log events under exec reach the receiver with the run's token (not 401);
    a command whose logs go to a collector of its own keeps its headers: no token goes there."""
    from watchdog.gateways.exec.environment import otlp_env

    traces = "http://127.0.0.1:4318/v1/traces"
    env = otlp_env({"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme"}, run_id="r1", endpoint=traces, token="aw1.r1.mac")
    assert env["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"] == "http://127.0.0.1:4318/v1/logs"
    assert env["OTEL_EXPORTER_OTLP_LOGS_HEADERS"] == "x-tenant=acme,Authorization=Bearer%20aw1.r1.mac"
    assert env["OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"] == "http/protobuf"
    same = otlp_env({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://127.0.0.1:4318/v1/logs",
                     "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "Authorization=Bearer%20old"}, run_id="r1", endpoint=traces,
                    token="aw1.r1.mac")
    assert same["OTEL_EXPORTER_OTLP_LOGS_HEADERS"] == "Authorization=Bearer%20aw1.r1.mac"
    for elsewhere in ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "https://collector.example/v1/logs"},
                      {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example"}):
        env = otlp_env(elsewhere, run_id="r1", endpoint=traces, token="aw1.r1.mac")
        assert "OTEL_EXPORTER_OTLP_LOGS_HEADERS" not in env and "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT" not in env
