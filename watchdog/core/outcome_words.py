"""Alert texts of the outcomes that no run's facts word: circuits, quarantine, the outbox's
refusals, the clock, the OTLP receiver, summaries, rows the daemon cannot read whole. Pure:
numbers and names in, title and body out (the table, watchdog.core.outcomes, picks these).
A writer's text (a run id, an agent's or a tool's name, an error) is marked (watchdog.core.text).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence

from watchdog.core.budgets import Budgets
from watchdog.core.text import TEXT_CHARS, ident, marked, run_ref, show_command
from watchdog.core.messages import RunFacts, escalation_alert, reason_of, title_reason


def owner_alert(run_id: str, agent: str, owner: str | None) -> tuple[str, str]:
    who = f"owner {owner}" if owner else "an owner that cannot be proven (no owner column, no sealed attestation)"
    line = (f"run {ident(run_id)} names the profile of agent {marked(agent)}, which its {who} may not use: "
            "judged by [defaults]")
    return (f"agent-watchdog: {run_ref(run_id)} may not use its profile — judged by [defaults]",
            line + ".\nIts profile's `owners` do not name it. Every budget of [defaults] applies.")


def pause_denied_alert(run_id: str, agent: str) -> tuple[str, str]:
    title = f"agent-watchdog: pause of {run_ref(run_id)} not confirmed — it goes on"
    body = (f"run {ident(run_id)}\nagent {marked(agent)}\n"
            "Its row was set paused in the store, but no budget that pauses for its profile is reached by "
            "the daemon's own counters: the pause is not confirmed and the run is running again, judged "
            "by every budget. The store's pause text is not quoted.")
    return title, body


def quarantine_alert(shown: str, what: str, event_id: int | None, has_run: bool) -> tuple[str, str]:
    subject = f"event {event_id} of {run_ref(shown)}" if event_id is not None else run_ref(shown)
    title = f"agent-watchdog: {subject} cannot be judged — quarantined"
    body = (f"run {ident(shown)}\nwhat is wrong: {marked(what, TEXT_CHARS)}\n"
            + ("This event is skipped (the scan moved past it); the run's other events count as usual.\n"
               if event_id is not None else
               "This run's row cannot be judged: no budget is enforced on it until the row is fixed. "
               "Written by hand, by a client in another language, or corrupted.\n")
            + "Every other run is judged as usual.\n"
            + (show_command(shown) if has_run else ""))
    return title, body


def quarantine_many_alert(per_hour: int) -> tuple[str, str]:
    return (f"agent-watchdog: more than {per_hour} malformed rows this hour — quarantined",
            f"More than {per_hour} rows or events of the store could not be judged this hour; each "
            f"is recorded as a `quarantined` intervention (not alerted one by one). Every other run is "
            f"judged as usual. Someone or something is writing malformed rows: look at the interventions "
            f"(agent-watchdog show RUN) and at the writers of the store.")


def circuit_open_alert(tool: str, errors: int, window_s: float, threshold: int, common: str | None, runs: int,
                       until: dt.datetime) -> tuple[str, str]:
    return (f"agent-watchdog: a tool's circuit is OPEN — {errors} errors in {window_s:g} s",
            "\n".join([f"tool {marked(tool)}", f"errors {errors} in {window_s:g} s (threshold {threshold})",
                       f"most common error: {marked(common or '-', TEXT_CHARS)}", f"runs affected: {runs}",
                       f"calls fail fast until {until:%H:%M:%S} UTC, then one probe is let through",
                       "agent-watchdog circuits   # lists it; `agent-watchdog circuits close TOOL` closes it by hand"]))


def circuit_reopen_alert(tool: str, error: str | None, until: dt.datetime) -> tuple[str, str]:
    return ("agent-watchdog: a tool's circuit is OPEN again — the probe failed",
            "\n".join([f"tool {marked(tool)}", f"probe error: {marked(error or '-', TEXT_CHARS)}",
                       f"calls fail fast until {until:%H:%M:%S} UTC"]))


def circuit_closed_alert(tool: str, why: str) -> tuple[str, str]:
    # `why` is the daemon's phrase with a run id or an actor in it: the title keeps the phrase only.
    how = "closed by hand" if why.startswith("closed by hand") else "the probe call succeeded"
    return (f"agent-watchdog: a tool's circuit is closed — {how}",
            "\n".join([f"tool {marked(tool)}", f"closed: {marked(why, TEXT_CHARS)}"]))


def tool_rate_alert(tool: str, calls: int, limit: int) -> tuple[str, str]:
    return (f"agent-watchdog: LOOP? a tool: {calls} calls/min over all runs",
            f"tool {marked(tool)}\n{calls} calls/min over all runs > max_calls_per_min {limit}")


def forged_alerts_alert(host: str, ids: list[int]) -> tuple[str, str]:
    shown = ", ".join(map(str, ids[:20])) + (" …" if len(ids) > 20 else "")
    # Their text is never repeated: it is exactly what someone wanted a human to read.
    return (f"agent-watchdog: refused {len(ids)} alert row(s) this daemon did not compose",
            f"host {host}\n{len(ids)} row(s) of the alerts table carry no valid seal of this "
            f"daemon: someone who can write the store inserted or changed them. Not delivered.\n"
            f"alert ids: {shown}\n(further refusals this hour are logged, not alerted)")


def clock_alert(host: str, skew_s: float, line: str, database: bool) -> tuple[str, str]:
    return (f"agent-watchdog: clock jump of {skew_s:+.0f} s on {host}",
            f"{line}. Durations measured across the jump would be false: a healthy run would look "
            f"an hour old, a runaway young. Check NTP / timedatectl on "
            f"{'the database server' if database else host}.")


def otlp_flood_alert(sender: str, limit: int) -> tuple[str, str]:
    return ("agent-watchdog: an OTLP sender starts too many runs — refused (429)",
            f"sender {marked(sender)} started more than {limit} span-only runs within a minute: its new runs "
            "are refused with HTTP 429 until its rate falls ([otlp] max_new_runs_per_min); its runs "
            "already open are still counted.")


def session_claimed_alert(cli: str, uid: int, session: str, runs: list[str], sender: str) -> tuple[str, str]:
    """A store writer made a look-alike of a coding CLI's hook run (watchdog.daemon.otlp.logruns)."""
    ids = ", ".join(ident(r) for r in runs)
    return ("agent-watchdog: several runs claim a coding CLI's session — none gets its log events",
            f"hook runs {ids} (and maybe more) of Unix user {uid} all claim {marked(cli)} session "
            f"{marked(session)}: a writer of the store made a look-alike of the hook's run. The log events "
            f"of that session from sender {marked(sender)} count on a run of the sender's own until one "
            "run claims it.")


def stops_summary_alert(n: int, reasons: Counter[str], agents: Counter[str], per_min: int,
                        shown: int) -> tuple[str, str]:
    """Numbers and identifiers only: how many, why, which agents."""
    def top(c: Counter[str], name: bool) -> str:
        names = ", ".join(f"{marked(k) if name else reason_of(k)} ×{v}" for k, v in c.most_common(shown))
        rest = len(c) - shown
        return names + (f", and {rest} more" if rest > 0 else "")

    title = f"agent-watchdog: {n} more runs stopped (summarised past {per_min} alerts/min)"
    body = "\n".join([
        f"{n} runs ended with a stop the daemon did not decide (the runs' own guards, a gateway, "
        "agent-watchdog kill or another store writer); each is recorded",
        f"reasons: {top(reasons, False)}",
        f"agents: {top(agents, True)}",
        "",
        "agent-watchdog runs --status killed",
    ])
    return title, body


def unreadable_lost_alert(run_id: str, pid: int, host: str) -> tuple[str, str]:
    return (f"agent-watchdog: {run_ref(run_id)} lost — its process is gone",
            f"run {ident(run_id)}\nIts process {pid} on {marked(host)} is gone without ending the run. "
            "Its row could not be judged (quarantined); it is marked lost.")


def unreadable_stop_alert(run_id: str, reason: str, detail: str) -> tuple[str, str]:
    return (f"agent-watchdog: {run_ref(run_id)} asked to stop; not signalled — {title_reason(reason)} "
            "(its row cannot be judged)",
            f"run {ident(run_id)}\nreason: {reason_of(reason)}: {detail}\nIts row cannot be judged (quarantined), so "
            "its wall clock ran from when the daemon first saw it. Cooperative stop requested: a "
            "row that cannot be read never leads to a signal.")


def row_locked_alert(run_id: str, status: str, waited_ms: int, ticks: int,
                     holders: Sequence[tuple[str, int]] = ()) -> tuple[str, str]:
    """A run whose row another session holds locked (on PostgreSQL, a login may lock its own run
    and leave its transaction open): the daemon can write nothing of it, so it says so."""
    state = status if status in ("running", "paused", "stopping") else "active"
    return (f"agent-watchdog: {run_ref(run_id)} cannot be stopped: another session holds its row locked",
            f"run {ident(run_id)} ({state})\nThe daemon waited {waited_ms} ms for the run's row lock at {ticks} "
            "ticks in a row and gave up each time: another session (an open transaction, most likely the "
            "run's own writer's) holds it. Until it is released nothing of this run is recorded, stopped or "
            "signalled; the daemon tries again every tick and carries out what is due once the lock goes. "
            "Every other run is judged as usual. To release it, end that session: pg_stat_activity names it "
            "(pg_blocking_pids), pg_terminate_backend ends it." + _holders(holders))


def _holders(holders: Sequence[tuple[str, int]]) -> str:
    """The sessions seen holding the row (login, pid): logins are the database's, still marked."""
    if not holders:
        return ""
    shown = ", ".join(f"login {marked(login)} (pid {int(pid)})" for login, pid in holders[:5])
    more = f", and {len(holders) - 5} more" if len(holders) > 5 else ""
    return f"\nHeld by: {shown}{more}."


def row_lock_ended_alert(run_id: str, status: str, waited_ms: int, ticks: int,
                         ended: Sequence[tuple[str, int]]) -> tuple[str, str]:
    """The daemon ended the session(s) of a confined writer's login (an agent's or a gateway's) that
    held a run's row locked at `ticks` ticks in a row (watchdog.daemon.tick.row_holders)."""
    state = status if status in ("running", "paused", "stopping") else "active"
    who = ", ".join(f"login {marked(login)} (pid {int(pid)})" for login, pid in ended[:5])
    more = f", and {len(ended) - 5} more" if len(ended) > 5 else ""
    return (f"agent-watchdog: {run_ref(run_id)}: ended a session that held its row locked",
            f"run {ident(run_id)} ({state})\nThe daemon waited {waited_ms} ms for the run's row lock at {ticks} "
            "ticks in a row, held by the same open transaction each time, and gave up each time. That session "
            f"belongs to a confined writer's login (the agents' or the gateway's role): the daemon ended it: {who}{more}. "
            "Its open transaction is rolled back; the run's step (its stop, if due) is then taken at once. "
            "A writer that keeps its transaction open on a run's row is misbehaving: check that login's client.")


def redrive_alert(f: RunFacts, b: Budgets, reason: str, outcome: str) -> tuple[str, str]:
    _, body = escalation_alert(f, b, reason, outcome, failed=False)
    return f"agent-watchdog: stop of {run_ref(f.id)} driven again by an operator — {title_reason(reason)}", body
