-- agent-watchdog on PostgreSQL: the agents' role, and what it may write.
--
-- Two roles share the store:
--   * the daemon's role (e.g. agent_watchdog) OWNS the tables: it runs
--     `agent-watchdog db upgrade` and the daemon, and is the only writer of
--     interventions, alerts, settings, daemons, tool_circuits and attestations;
--   * the agents' role (default agent_watchdog_agents, NOLOGIN) is granted to
--     each agent's login role. It registers runs, inserts events, updates its
--     run's counters and status (a stop request, the end of the run), reads the
--     settings and the circuits, and claims a half-open circuit probe by INSERT
--     into circuit_probes. Nothing else: it cannot queue an alert, publish
--     settings, attest a process, change a circuit, a run's identity (host, pid,
--     create time, kill mode) or the stop ladder's state (signal_stage).
--
-- Run it as a superuser or as the tables' owner, after `db upgrade` and again
-- after every upgrade (a table added later has no grant until then: agents are
-- refused, never allowed, by default):
--
--   psql -v ON_ERROR_STOP=1 -d agent_watchdog -f sql/postgres-roles.sql
--   psql ... -v agents_role=my_agents ...   # another name for the agents' role
--
-- then, per agent login:  GRANT agent_watchdog_agents TO agent_alice;

\if :{?agents_role}
\else
\set agents_role agent_watchdog_agents
\endif

SELECT format('CREATE ROLE %I NOLOGIN', :'agents_role')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'agents_role') \gexec

BEGIN;

-- Start from nothing on every table of the store, then grant exactly what the SDK runs.
REVOKE ALL ON runs, events, interventions, alerts, tool_circuits, circuit_probes, settings, daemons,
              attestations, alembic_version FROM PUBLIC, :"agents_role";
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM PUBLIC, :"agents_role";
GRANT USAGE ON SCHEMA public TO :"agents_role";

-- Runs: register, read the status back, update only the columns the SDK writes.
GRANT SELECT, INSERT ON runs TO :"agents_role";
-- (parent_id: a child run names its parent once, at start; paused_at: its guard pauses it; partial:
-- run.partial(). Never its budgets or `resumes`: only `agent-watchdog resume` raises those.)
GRANT UPDATE (steps, tool_calls, tool_errors, tokens_in, tokens_out, cost_eur, cached_tokens_in, reasoning_tokens,
              cost_unpriced_tokens, last_seq, last_seen_at, progress,
              status, stop_reason, stop_detail, stop_requested_at, ended_at, parent_id, paused_at, partial)
   ON runs TO :"agents_role";

-- Events: insert only (other runs' events are not an agent's to read).
GRANT INSERT ON events TO :"agents_role";
SELECT format('GRANT USAGE ON SEQUENCE %s TO %I', pg_get_serial_sequence('events', 'id'), :'agents_role') \gexec

-- What the daemon publishes, read only.
GRANT SELECT ON settings, tool_circuits TO :"agents_role";

-- The half-open probe: the first INSERT of (tool, opened_at) wins it, and the winner marks it
-- ok when its call succeeded (the SDK then lets calls through); the daemon judges it from the events.
GRANT SELECT, INSERT ON circuit_probes TO :"agents_role";
GRANT UPDATE (ok) ON circuit_probes TO :"agents_role";

COMMIT;
