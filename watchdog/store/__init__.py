"""All SQL of agent-watchdog: the table contract, engines, the SDK's hot statements,
audit writes and read models. The engine helpers are re-exported here; the tables are not
(`watchdog.store.schema` holds them, and only the store imports it): a table re-exported under
the name of a store module (`alerts`, `interventions`, `settings`) made
`from watchdog.store import alerts` bind the table or the module depending on import order."""

from watchdog.store.engine import make_engine, normalise_url, read_connection

__all__ = ["make_engine", "normalise_url", "read_connection"]
