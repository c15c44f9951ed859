"""Prometheus metrics (optional extra `metrics`). Bounded label sets: never a run id as a label."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from watchdog.core.lifecycle import STOP_REASONS  # the bounded label set of `reason`

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from watchdog.daemon.alerts.notify import TargetResult
    from watchdog.daemon.tick.ticker import TickReport

MAX_TOOL_LABELS = 200  # tools beyond this share the label "other": cardinality stays bounded


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram
        except ImportError:
            from watchdog.errors import ConfigError

            raise ConfigError("metrics.listen needs the `metrics` extra (prometheus_client): pip install "
                              "'agent-watchdog-daemon[metrics]', or '.[metrics]' from a checkout") from None
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.active = Gauge("agent_watchdog_active_runs", "Runs running or stopping", ["status"], registry=r)
        self.interventions = PCounter("agent_watchdog_interventions",
                                      "Stops requested (by the daemon, a guard, a gateway or the CLI), by reason",
                                      ["reason"], registry=r)
        self.lost = PCounter("agent_watchdog_runs_lost", "Runs whose process vanished", registry=r)
        self.alerts = PCounter("agent_watchdog_alert_deliveries", "Alert deliveries per target outcome", ["outcome"],
                               registry=r)
        self.dead_letters = PCounter("agent_watchdog_alerts_dead_lettered",
                                     "Alerts dead-lettered: never delivered within alert_expire_s, or unusable rows",
                                     ["reason"], registry=r)
        self.tick = Histogram("agent_watchdog_tick_seconds", "Tick duration",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.skipped = PCounter("agent_watchdog_ticks_skipped", "Ticks skipped because the previous one ran late",
                                registry=r)
        self.failed = PCounter("agent_watchdog_ticks_failed", "Ticks that failed (database down...)", registry=r)
        self.clock_jumps = PCounter("agent_watchdog_clock_jumps", "Jumps of the store's clock against the monotonic "
                                    "clock (durations not judged for that tick)", registry=r)
        self.tool_calls = PCounter("agent_watchdog_tool_calls", "Tool calls seen, by tool", ["tool"], registry=r)
        self.tool_errors = PCounter("agent_watchdog_tool_errors", "Tool errors seen, by tool", ["tool"], registry=r)
        self.unpriced = PCounter("agent_watchdog_unpriced_tokens", "Tokens of steps no price table prices, by model",
                                 ["model"], registry=r)
        self.backfilled = PCounter("agent_watchdog_steps_priced_by_daemon",
                                   "Steps the SDK could not price that the daemon priced", registry=r)
        self.period_spend = Gauge("agent_watchdog_period_spend_eur", "Spend of each period budget's scope",
                                  ["scope", "period"], registry=r)
        self.period_budget = Gauge("agent_watchdog_period_budget_eur", "Each period budget (0 = none)",
                                   ["scope", "period"], registry=r)
        # For the alert rules (contrib/prometheus/alerts.yml, issue 24): "not ticking" and "tick
        # slower than tick_s" need the last tick's time and the configured period; "circuits open"
        # the circuits by state (one row per tool in tool_circuits: a cheap count).
        self.last_tick = Gauge("agent_watchdog_last_tick_timestamp_seconds", "When the last tick ended (Unix time)",
                               registry=r)
        self.tick_interval = Gauge("agent_watchdog_tick_interval_seconds", "The configured tick period ([daemon] tick_s)",
                                   registry=r)
        self.circuits = Gauge("agent_watchdog_circuits", "Tool circuit breakers by state", ["state"], registry=r)
        self._tools: set[str] = set()
        self._models: set[str] = set()
        self._scopes: set[str] = set()

    def _tool(self, name: str) -> str:
        return self._bounded(self._tools, name)

    def observe_tick(self, rep: TickReport) -> None:
        self.tick.observe(rep.duration_s)
        self.last_tick.set_to_current_time()
        self.active.labels("running").set(rep.active - rep.stopping)
        self.active.labels("stopping").set(rep.stopping)
        # issue 36: every stop once, the daemon's and those it heard (a guard's, a gateway's, the CLI's)
        for _rid, reason in [*rep.stops, *getattr(rep, "heard", ())]:
            self.interventions.labels(reason if reason in STOP_REASONS else "other").inc()
        if rep.lost:
            self.lost.inc(len(rep.lost))
        calls: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        for e in getattr(rep, "events", ()):
            calls[self._tool(e.tool)] += 1
            if e.ok is False:
                errors[self._tool(e.tool)] += 1
        for tool, n in calls.items():
            self.tool_calls.labels(tool).inc(n)
        for tool, n in errors.items():
            self.tool_errors.labels(tool).inc(n)
        for model, tokens in getattr(rep, "unpriced", {}).items():
            self.unpriced.labels(self._bounded(self._models, model)).inc(tokens)
        if getattr(rep, "priced_steps", 0):
            self.backfilled.inc(rep.priced_steps)
        for st in getattr(rep, "periods", ()):
            name = self._bounded(self._scopes, f"{st.scope.kind}:{st.scope.name}")
            self.period_spend.labels(name, st.period).set(st.spent_eur)
            self.period_budget.labels(name, st.period).set(st.budget_eur)

    @staticmethod
    def _bounded(seen: set[str], name: str) -> str:
        if name in seen or len(seen) < MAX_TOOL_LABELS:
            seen.add(name)
            return name
        return "other"

    def observe_circuits(self, counts: dict[str, int], tick_s: float) -> None:
        """`counts`: circuits per state (watchdog.store.viewer.circuit_counts); every state shown, 0 too."""
        from watchdog.core.lifecycle import Circuit

        for state in (Circuit.CLOSED, Circuit.OPEN, Circuit.HALF_OPEN):
            self.circuits.labels(str(state)).set(counts.get(str(state), 0))
        self.tick_interval.set(tick_s)

    def tick_skipped(self) -> None:
        self.skipped.inc()

    def tick_failed(self) -> None:
        self.failed.inc()

    def clock_jumped(self) -> None:
        self.clock_jumps.inc()

    def alert_result(self, result: TargetResult) -> None:
        self.alerts.labels("delivered" if result.ok else "failed").inc()

    def alert_dead(self, reason: str) -> None:
        self.dead_letters.labels(reason).inc()  # reason: outbox.EXPIRED | outbox.UNUSABLE


def start_metrics(listen: str) -> Metrics:
    """Serve /metrics on host:port in a background thread."""
    from prometheus_client import start_http_server

    metrics = Metrics()
    host, _, port = listen.rpartition(":")
    start_http_server(int(port), addr=host.strip("[]"), registry=metrics.registry)
    return metrics
