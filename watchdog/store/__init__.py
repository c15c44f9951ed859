"""All SQL of agent-watchdog: the table contract, engines, the SDK's hot statements,
audit writes and read models. The tables and the engine helpers are re-exported here."""

from watchdog.store.engine import make_engine, normalise_url, read_connection
from watchdog.store.schema import alerts, daemons, events, interventions, metadata, runs, settings, tool_circuits, utcnow

__all__ = ["make_engine", "normalise_url", "read_connection", "alerts", "daemons", "events", "interventions",
           "metadata", "runs", "settings", "tool_circuits", "utcnow"]
