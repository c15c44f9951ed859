"""`agent-watchdog exec`: register and attest the run, start the command, watch it, end the run.

Exit status as timeout(1): the command's own; 128+N when it died of signal N; 124 when the
watchdog stopped the run (the reason on stderr); 125 when exec itself failed; 126 / 127 when
the command cannot run / is not found.

Single-threaded: the supervised signals are blocked and waited for (sigtimedwait), so a
signal is handled between two steps, never inside one, and the child unblocks them before it
execs. Only exec ends the run: completed / failed by the command's status, killed on a stop.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from watchdog.core import budgets as bud
from watchdog.core import lifecycle as lc
from watchdog.core.config import Config
from watchdog.gateways.exec import cgroup as cg
from watchdog.gateways.exec import reaper as rp
from watchdog.gateways.exec import spawn
from watchdog.gateways.exec.exits import EXIT_FAILED, say
from watchdog.gateways.exec.environment import command_env, otlp_endpoint, otlp_env, otlp_listen
from watchdog.gateways.exec.tree import Tree
from watchdog.gateways.exec.watch import Watch

if TYPE_CHECKING:
    from watchdog.sdk.client import Watchdog
    from watchdog.sdk.run import Run

# Tree mode's one gap (watchdog.daemon.stops.exectree): said with -v wherever the run is `tree`.
TREE_WINDOW = ("kill mode tree: if exec is killed, the daemon takes down the descendants it pinned at each tick; "
               "one born and orphaned within one tick escapes it, so a command that means to escape can "
               "(--kill-mode cgroup has no such window: use it wherever it is available)")


class ExecFailed(Exception):
    """exec's own failure (exit 125): the message is its one line on stderr."""


@dataclass
class ExecOptions:
    agent: str
    argv: list[str]
    db_url: str
    config: Config
    socket: str
    config_path: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    budgets: dict[str, float | None] = field(default_factory=dict)  # max_steps, max_tool_calls, max_cost_eur, max_wall_s
    kill_mode: str | None = None  # "tree" | "cgroup" | None (a cgroup where possible, else tree)
    verbose: bool = False


def run_exec(opts: ExecOptions) -> int:
    """The whole of `agent-watchdog exec`; returns its exit status."""
    signal.pthread_sigmask(signal.SIG_BLOCK, spawn.SUPERVISED_SIGNALS)
    try:
        return _Session(opts).execute()
    except ExecFailed as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 — exec's own bug or an OS refusal: 125, one line
        say(f"error: {type(exc).__name__}: {_one_line(exc)}")
        return EXIT_FAILED


class _Session:
    def __init__(self, opts: ExecOptions):
        self.opts = opts
        self.run_id = uuid.uuid4().hex
        self.placement: cg.Placement | None = None
        self.wd: Watchdog | None = None  # once the store is open
        self.run: Run | None = None  # once registered
        self.asked: bud.RunBudgets = {}  # the budgets the run asks for (never above the profile)
        self.otlp: dict[str, str] | None = None  # the daemon's receiver and the run's token (attestation)
        self.attest_why = "not asked"

    def note(self, msg: str) -> None:
        if self.opts.verbose:
            say(msg)

    def execute(self) -> int:
        o = self.opts
        if not rp.become_subreaper():
            self.note("PR_SET_CHILD_SUBREAPER failed: orphans of the command reparent to init")
        self.placement, mode = self._place()
        self._open_store(mode)
        # The daemon's receiver: what it says over its socket at attestation (with the run's own
        # token), else this config's [otlp] listen, else what the daemon published in the store.
        listen = otlp_listen(o.config) or otlp_listen(self._published())
        systemd = self.placement is not None and self.placement.systemd  # attested after the command starts
        env = command_env(os.environ, run_id=self.run_id, db_url=o.db_url, socket=o.socket,
                          config_path=o.config_path)
        argv = self.placement.command(o.argv) if self.placement else list(o.argv)
        child = spawn.start(argv, env)
        reaper = rp.Reaper(child.pid)
        try:
            if self.placement is not None and not self.placement.systemd:
                mode = self._move(self.placement, child.pid, mode)
            self._register(mode)
        except BaseException as exc:
            child.abandon()
            _wait(child.pid)
            self._cleanup()
            if isinstance(exc, ExecFailed):
                raise
            raise ExecFailed(_one_line(exc)) from None
        attested = False
        if not systemd:
            attested = self.attest(mode)
        else:  # attested once the command runs in its scope: the receiver and token before
            from watchdog.sdk.attest import request_reply

            ok, self.attest_why, _key, self.otlp = request_reply(o.socket, self.run_id, None, otlp_only=True)
        err = child.release(self._otlp_env(env, listen, attested))
        if err is not None:
            _wait(child.pid)
            code = spawn.exit_status_for(err)
            what = "not found" if code == spawn.EXIT_NOT_FOUND else "cannot be run"
            say(f"{o.argv[0]}: {what} ({os.strerror(err)})")
            self.end(lc.FAILED, f"command {what}: {os.strerror(err)}")
            self._cleanup()
            return code
        if self.placement is not None and self.placement.systemd:
            try:
                self.placement.locate(child.pid, reaper.command_running)
                self.note(f"the command runs in {self.placement.path}")
            except cg.CgroupImpossible as exc:
                self.note(f"{exc}; the run is watched as a tree")
            attested = self.attest(mode)
        tree = Tree(reaper, self.placement)
        watch = Watch(self, tree, attested)
        try:
            return watch.loop()
        finally:
            self._cleanup()

    # -- setup -------------------------------------------------------------------

    def _place(self) -> tuple[cg.Placement | None, str]:
        if self.opts.kill_mode == lc.TREE:
            self.note("kill mode tree: the command's tree is held by exec as its child subreaper (no cgroup)")
            self.note(TREE_WINDOW)
            return None, lc.TREE
        try:
            placement = cg.plan(self.run_id)
        except cg.CgroupImpossible as exc:
            if self.opts.kill_mode == lc.CGROUP:
                raise ExecFailed(f"--kill-mode cgroup is impossible here: {exc}") from None
            self.note(f"no cgroup of its own ({exc}); kill mode tree: exec holds the tree as its child subreaper")
            self.note(TREE_WINDOW)
            return None, lc.TREE
        where = placement.directory or f"a scope named {cg.rules.scope_unit(self.run_id)}"
        self.note(f"kill mode cgroup: the command runs in {where} ({placement.how})")
        return placement, lc.CGROUP

    def _move(self, placement: cg.Placement, pid: int, mode: str) -> str:
        try:
            placement.place(pid)
            return mode
        except OSError as exc:
            if self.opts.kill_mode == lc.CGROUP:
                raise ExecFailed(f"--kill-mode cgroup is impossible here: cannot move the command into "
                                 f"{placement.directory} ({exc.strerror})") from None
            self.note(f"cannot move the command into {placement.directory} ({exc.strerror}); kill mode tree")
            self.note(TREE_WINDOW)
            placement.remove()
            self.placement = None
            return lc.TREE

    def _open_store(self, mode: str) -> None:
        from watchdog.sdk.client import Watchdog

        try:
            # Attestation is exec's own (it carries the cgroup): the SDK's is off.
            self.wd = wd = Watchdog(self.opts.db_url, attest_socket="")
            profile = wd.config().profile(self.opts.agent)
        except Exception as exc:  # noqa: BLE001 — a bad URL or config: exec's own failure
            self._cleanup()
            raise ExecFailed(_one_line(exc)) from None
        asked: dict[str, float] = {}
        for key, value in self.opts.budgets.items():
            if value is None:
                continue
            if key not in bud.RUN_BUDGET_KEYS:
                self._cleanup()
                raise ExecFailed(f"--{key.replace('_', '-')}: not a budget a run may ask for")
            try:
                value = bud.BY_KEY[key].validate(value)
            except ValueError as exc:
                self._cleanup()
                raise ExecFailed(f"--{key.replace('_', '-')}: {exc}") from None
            limit = getattr(profile, key)
            if value > limit and not profile.runs_may_raise:
                self.note(f"--{key.replace('_', '-')} {value:g} is above the profile's {limit:g}: the profile's holds")
                value = limit
            asked[key] = value
        self.asked = cast(bud.RunBudgets, asked)  # every key is a run budget (checked above)

    def store(self) -> Watchdog:
        """The store exec opened: _open_store comes first, so every later step has it."""
        if self.wd is None:
            raise ExecFailed("the store is not open")
        return self.wd

    def registered(self) -> Run:
        """The run exec registered: the watch starts after _register, so it always has it."""
        if self.run is None:
            raise ExecFailed("the run is not registered")
        return self.run

    def _published(self) -> dict[str, Any]:
        try:
            return self.store().settings()
        except Exception:  # noqa: BLE001 — no published config: no OTLP
            return {}

    def _register(self, mode: str) -> None:
        from watchdog.sdk.run import Run

        wd = self.store()
        run = wd.run(self.opts.agent, kill_mode=mode, labels=self.opts.labels or None, run_id=self.run_id,
                     guards=False, **self.asked)
        if not isinstance(run, Run):  # pragma: no cover — wd.run returns a Run
            raise ExecFailed("could not open the run")
        run.source = lc.Source.EXEC
        run.start()
        self.run = run
        self.note(f"run {self.run_id} ({self.opts.agent}, kill mode {mode}) registered in the store")

    def attest(self, mode: str) -> bool:
        """Ask the daemon over its socket to attest the run (with its cgroup); True when it did."""
        from watchdog.sdk.attest import request_reply

        # The cgroup's directory (under the cgroup2 mount), as the daemon checks it.
        path = self.placement.directory if self.placement is not None else None
        ok, why, _key, self.otlp = request_reply(self.opts.socket, self.run_id, mode, cgroup=path)
        self.attest_why = why
        self.note("attested by the daemon" if ok else
                  f"not attested ({why}): the run is watched and stopped by exec; the daemon will not "
                  "signal its tree")
        return ok

    def _otlp_env(self, env: dict[str, str], listen: str, attested: bool) -> dict[str, str]:
        """The OTel variables for the command, once the daemon has answered; said once, loudly,
        when the command's spans cannot be counted for its run."""
        if self.otlp is not None:
            self.note(f"OTel spans go to {self.otlp['endpoint']} with the run's own token")
            return otlp_env(env, run_id=self.run_id, endpoint=self.otlp["endpoint"], token=self.otlp["token"])
        endpoint = otlp_endpoint(listen)
        if endpoint is not None:  # a receiver, and no token for it
            say(f"run {self.run_id[:8]}: OTel spans of the command cannot be counted for it: the daemon did not "
                f"attest the run ({self.attest_why[:120]}), so it handed no OTLP token; set AGENT_WATCHDOG_SOCKET "
                "to the daemon's [daemon] socket")
            return otlp_env(env, run_id=self.run_id, endpoint=endpoint, token=None)
        self.note("no OTLP receiver: the daemon " + ("has none on ([otlp] listen)" if attested else
                  f"did not attest the run ({self.attest_why[:120]}) and publishes none") +
                  ": OTel spans of the command are not counted")
        return {}

    # -- the end -----------------------------------------------------------------

    def end(self, status: str, detail: str | None, reason: str | None = None) -> None:
        """End the run in the store (said on stderr, never raised, when the store refuses)."""
        if self.run is not None:
            try:
                self.run.end(status, reason, detail)
            except Exception as exc:  # noqa: BLE001 — the command's status is still ours to give
                say(f"could not end run {self.run_id[:8]} in the store ({_one_line(exc)})")

    def _cleanup(self) -> None:
        if self.placement is not None:
            self.placement.remove()
        if self.wd is not None:
            try:
                self.wd.close()
            except Exception:  # noqa: BLE001
                pass
            self.wd = None


def _wait(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0] if text else type(exc).__name__


def monotonic() -> float:
    return time.monotonic()
