"""exec's loop while the command runs: signals, the run's status, the keep-alive, the end.

- The run's status is read every POLL_S: `stopping` (the daemon, the CLI's kill, an in-process
  guard of the command) or an end someone else wrote takes the whole tree down: exit 124.
- Keep-alive: until the command has reported anything itself (its own SDK run's roll-up,
  spans, a gateway), exec keeps `last_seen_at` fresh, so a command that reports nothing is
  bounded by max_wall_s and its process, never judged silent. Once it has reported, exec
  stops: silence is then the command's own.
- A signal sent to exec (SIGTERM, SIGHUP, SIGQUIT, and SIGINT unless the terminal sent it,
  which already reached the whole foreground group) is forwarded to every member once.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Protocol, TypeGuard

from watchdog.core import lifecycle as lc
from watchdog.core.text import one_line
from watchdog.errors import RunKilled
from watchdog.gateways.exec import reaper as rp
from watchdog.gateways.exec import spawn
from watchdog.gateways.exec.exits import EXIT_STOPPED, say
from watchdog.store.joined import ExecRunState, killed_child, read_state
from watchdog.core.periods import utcnow

if TYPE_CHECKING:
    from watchdog.core.config import Config
    from watchdog.gateways.exec.tree import Tree
    from watchdog.sdk.client import Watchdog
    from watchdog.sdk.run import Run

POLL_S = 0.25
WAIT_S = 0.1
ATTEST_RETRY_S = 30.0
BEAT_MAX_S = 30.0
BACKSTOP_SLACK_S = 5.0  # past max_wall_s (and two ticks) before exec stops the run itself
SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel sent (the terminal's Ctrl-C)


class Options(Protocol):
    config: Config  # exec's own config (the grace when the daemon published none)


class Session(Protocol):
    """What the watch asks of exec's session (watchdog.gateways.exec.supervisor, which starts the
    watch: a protocol, so this module never imports the supervisor back)."""

    run_id: str

    @property
    def opts(self) -> Options: ...

    def note(self, msg: str) -> None: ...

    def store(self) -> Watchdog: ...

    def registered(self) -> Run: ...

    def attest(self, mode: str) -> bool: ...

    def end(self, status: str, detail: str | None, reason: str | None = None) -> None: ...


class Watch:
    def __init__(self, session: Session, tree: Tree, attested: bool) -> None:
        self.s = session
        self.tree = tree
        self.attested = attested
        self.reported = False
        self._mine: object = None  # last_seen_at as exec's own keep-alive left it
        self._warned_store = False

    # -- the store -------------------------------------------------------------------

    def state(self) -> ExecRunState | None:
        try:
            return read_state(self.s.store().writer, self.s.run_id)
        except Exception as exc:  # noqa: BLE001 — a store blip: the command runs on, asked again
            if not self._warned_store:
                self._warned_store = True
                self.s.note(f"cannot read the run's status ({type(exc).__name__}); retrying")
            return None

    def beat(self) -> None:
        run = self.s.registered()
        try:
            run.wd.writer.transaction([run.lineage.beat(utcnow())])
            st = read_state(run.wd.writer, run.id)
            if st is not None:
                self._mine = st.last_seen_at
        except Exception:  # noqa: BLE001 — a keep-alive: the next one may get through
            pass

    @staticmethod
    def stopped(st: ExecRunState | None) -> TypeGuard[ExecRunState]:
        return st is not None and (st.status == lc.STOPPING or st.status not in lc.ACTIVE_STATUSES)

    def notice(self, st: ExecRunState) -> None:
        if not self.reported and (st.steps or st.tool_calls or (self._mine is not None and st.last_seen_at != self._mine)):
            self.reported = True
            self.s.note("the command reports itself: exec's keep-alive stops, silence is judged on its reports")
        if self._mine is None:
            self._mine = st.last_seen_at

    # -- the loop ----------------------------------------------------------------------

    def loop(self) -> int:
        run = self.s.registered()
        reaper = self.tree.reaper
        beat_every = min(BEAT_MAX_S, run.budgets.heartbeat_timeout_s / 4)
        next_poll = next_beat = 0.0
        next_attest = time.monotonic() + ATTEST_RETRY_S
        stop: ExecRunState | None = None
        # exec's own backstop for max_wall_s, should no daemon stop the run (none runs, or it
        # is far behind): the daemon normally stops it within a tick of max_wall_s.
        wall_s = float(run.budgets.max_wall_s)
        backstop_at = time.monotonic() + wall_s + max(BACKSTOP_SLACK_S, 2 * self._tick_s())
        while stop is None:
            reaper.reap()
            if reaper.command_done:
                break
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + POLL_S
                st = self.state()
                if self.stopped(st):
                    stop = st
                    break
                if st is not None:
                    self.notice(st)
                    if not self.reported and now >= next_beat:
                        next_beat = now + beat_every
                        self.beat()
            if now >= backstop_at:
                backstop_at = float("inf")
                self.s.note(f"no stop from a daemon {wall_s:g} s into the run: exec stops it itself (wall_clock)")
                run.publish_stop(RunKilled(lc.WALL_CLOCK, f"running {run.elapsed_s:.0f} s > max_wall_s {wall_s:g} s "
                                                           "(exec's own clock: no daemon stopped it)"))
                next_poll = 0.0
                continue
            if not self.attested and now >= next_attest:
                next_attest = now + ATTEST_RETRY_S
                self.attested = self.s.attest(run.kill_mode)
            try:
                info = signal.sigtimedwait(spawn.SUPERVISED_SIGNALS, WAIT_S)
            except InterruptedError:
                info = None
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            st = self.state()
            if self.stopped(st):  # the daemon's own SIGTERM after a stop: the stop path handles it
                stop = st
                break
            if info.si_signo == signal.SIGINT and info.si_code == SI_KERNEL:
                continue  # Ctrl-C: the terminal gave it to the whole foreground group already
            n = self.tree.forward(info.si_signo)
            self.s.note(f"{signal.Signals(info.si_signo).name} forwarded to {n} process{'es' if n != 1 else ''}")
        grace_s = self._grace_s()
        if stop is not None:
            return self.stop(stop, grace_s)
        status = reaper.status
        assert status is not None  # the loop ends on a stop (returned above) or on the command's exit
        code = rp.exit_code(status)
        if self.tree.members():
            termed, killed = self.tree.take_down(grace_s)
            self.s.note(f"the command exited; {termed} process(es) it left behind got SIGTERM"
                        + (f", {killed} SIGKILL" if killed else ""))
        st = self.state()
        if self.stopped(st):
            return self.stop(st, grace_s)
        child_stop = self._child_stop()
        if child_stop is not None and st is not None:  # the SDK inside stopped on this run's budgets
            reason, detail = child_stop
            return self.stop(ExecRunState(st.status, reason, detail, st.steps, st.tool_calls, st.last_seen_at), 0.0)
        if code == 0:
            self.s.end(lc.COMPLETED, None)
        else:
            how = f"killed by signal {code - 128}" if code > 128 and rp.os.WIFSIGNALED(status) else \
                f"exit status {code}"
            self.s.end(lc.FAILED, f"command {how}")
        return code

    def _tick_s(self) -> float:
        try:
            return float(self.s.store().config().daemon.tick_s)
        except Exception:  # noqa: BLE001
            return 5.0

    def _grace_s(self) -> float:
        """[daemon] term_grace_s as the daemon published it, else exec's config's."""
        try:
            return float(self.s.store().config().daemon.term_grace_s)
        except Exception:  # noqa: BLE001
            return float(self.s.opts.config.daemon.term_grace_s)

    def _child_stop(self) -> tuple[str, str | None] | None:
        try:
            return killed_child(self.s.store().writer, self.s.run_id)
        except Exception:  # noqa: BLE001 — the store is away: the command's own status stands
            return None

    def stop(self, st: ExecRunState, grace_s: float) -> int:
        termed, killed = self.tree.take_down(grace_s)
        reason = st.stop_reason or ("ended in the store" if st.status != lc.STOPPING else "stop requested")
        self.s.note(f"stop: SIGTERM to {termed} process(es)" + (f", SIGKILL to {killed}" if killed else ""))
        if st.status in lc.ACTIVE_STATUSES:
            self.s.end(lc.KILLED, st.stop_detail or "the process tree was taken down by agent-watchdog exec",
                        st.stop_reason)
        detail = f" ({one_line(st.stop_detail, 300)})" if st.stop_detail else ""
        say(f"run {self.s.run_id[:8]} stopped by agent-watchdog: {reason}{detail}")
        return EXIT_STOPPED
