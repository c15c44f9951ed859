-- agent-watchdog on PostgreSQL: the roles that share the store, and what each may do.
--
--   * the daemon's role (e.g. agent_watchdog) OWNS the tables: it runs
--     `agent-watchdog db upgrade` and the daemon, and is the only writer of
--     interventions, alerts, settings, daemons, tool_circuits and attestations.
--     It (and a superuser) is not confined by the rules below: it stops, books,
--     seals and rebases any run. It is granted pg_signal_backend (below): it
--     ends a confined writer's session (an agents' or a gateway's login, never
--     a superuser's or its own) that keeps a run's row locked from it at two
--     ticks in a row, which would otherwise keep that run from being stopped;
--   * the agents' role (default agent_watchdog_agents, NOLOGIN) is granted to
--     each agent's login role. It registers runs, inserts events, updates its
--     run's counters and status (a stop request, the end of the run), reads the
--     settings and the circuits, and claims a half-open circuit probe by INSERT
--     into circuit_probes. Nothing else: it cannot queue an alert, publish
--     settings, attest a process, change a circuit, a run's identity (host, pid,
--     create time, kill mode) or the stop ladder's state (signal_stage).
--     Since revision 0010 every run belongs to the login that inserted it
--     (runs.owner = session_user, written by the database) and row-level security
--     keeps each login to its own runs: it reads and changes only those, inserts
--     events only for them, names only one of them as a parent; a trigger writes
--     the server's now() for every time, lets counters only grow, budgets only
--     go down and the status move only forward (docs/explanation/security.md);
--   * the gateway's role (default agent_watchdog_gateway, NOLOGIN), for the
--     LiteLLM callback, the MCP proxy and the like: what the agents' role may do
--     with its own runs, plus reading every run (its stop status and budgets)
--     and appending events marked with a gateway source (events.source one of
--     otlp, litellm, mcp, or those of -v gateway_sources) to any run, numbered
--     in the witnesses' range (seq >= 2^30, watchdog.store.joined), of which it
--     reads the numbers (run_id, seq) to take the next one; never another
--     writer's events themselves. It never changes another owner's row. No
--     confined role but a gateway numbers an event in the witnesses' range, so
--     the run's own writer cannot squat it to blind its gateways;
--   * the viewer's role (default agent_watchdog_viewer, NOLOGIN), for `runs`,
--     `show`, `top`, `budgets`, `alerts` and `web`: reads every table and every
--     run (attestations without their MACs), writes nothing.
--
-- Run it as a superuser or as the tables' owner, after `db upgrade` (revision 0010
-- or later) and again after every upgrade (a table added later has no grant until
-- then: every role is refused, never allowed, by default):
--
--   psql -v ON_ERROR_STOP=1 -d agent_watchdog -f sql/postgres-roles.sql
--   psql ... -v agents_role=my_agents -v gateway_role=my_gw -v viewer_role=my_view ...   # other names
--
-- then, per login:  GRANT agent_watchdog_agents TO agent_alice;
--                   GRANT agent_watchdog_gateway TO litellm_proxy;
--                   GRANT agent_watchdog_viewer TO grafana_reader;
-- One login per agent: owners are logins, so agents that share a login (or a
-- PgBouncer `user=` that maps them onto one) share their runs (docs/explanation/security.md).

\if :{?agents_role}
\else
\set agents_role agent_watchdog_agents
\endif
\if :{?gateway_role}
\else
\set gateway_role agent_watchdog_gateway
\endif
\if :{?viewer_role}
\else
\set viewer_role agent_watchdog_viewer
\endif
-- The sources the gateway's role may mark events with (one gateway role per gateway: e.g.
-- -v gateway_role=aw_mcp_proxy -v gateway_sources=mcp).
\if :{?gateway_sources}
\else
\set gateway_sources otlp,litellm,mcp
\endif
SELECT format('DO $x$ BEGIN RAISE EXCEPTION %L; END $x$',
              'agent-watchdog: gateway_sources must be a comma list of otlp, litellm, mcp, not ' || :'gateway_sources')
 WHERE NOT (string_to_array(:'gateway_sources', ',') <@ ARRAY['otlp', 'litellm', 'mcp']) \gexec

-- The owners and their row-level security come with revision 0010: refuse to grant on an older store.
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM information_schema.columns
                  WHERE table_schema = current_schema() AND table_name = 'runs' AND column_name = 'owner') THEN
    RAISE EXCEPTION 'agent-watchdog: this store has no runs.owner: run `agent-watchdog db upgrade` first, then this script';
  END IF;
END $$;

SELECT format('CREATE ROLE %I NOLOGIN', r) FROM unnest(ARRAY[:'agents_role', :'gateway_role', :'viewer_role']) AS r
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) \gexec

BEGIN;

-- The daemon's login (the role owning the tables) ends a confined writer's session that keeps a
-- run's row locked from it (watchdog.daemon.tick.row_holders): an agents' login on its own run, a
-- gateway's on any run (its witnessed event locks the row), else any holder of a gateway's
-- credential keeps another user's runaway from being stopped. That takes pg_signal_backend (it
-- never reaches a superuser's session; the daemon checks the login's roles before it signals).
-- Reading which session holds the lock needs nothing more (pg_locks and pg_stat_activity's
-- backend_xid are every login's to read). Only a superuser (or a holder WITH ADMIN OPTION) may
-- grant it: run as the tables' owner, the script says what to run, and the daemon then only
-- alerts such a lock (and warns once that the grant is missing).
DO $$
DECLARE
  owner_role name := (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass('runs'));
BEGIN
  IF owner_role IS NULL OR pg_has_role(owner_role, 'pg_signal_backend', 'USAGE') THEN
    RETURN;
  END IF;
  EXECUTE format('GRANT pg_signal_backend TO %I', owner_role);
EXCEPTION WHEN insufficient_privilege THEN
  RAISE WARNING 'agent-watchdog: could not grant pg_signal_backend to %: as a superuser, run GRANT pg_signal_backend TO %;',
                owner_role, quote_ident(owner_role);
END $$;

-- No confined login may create objects in the store's schema. PostgreSQL 14 and older let every
-- login (PUBLIC) CREATE in schema public; 15 no longer does. With it, a writer could plant a
-- function overload of a closer argument type (CVE-2018-1058's pattern) that the daemon's own
-- statements would then run with the owner's rights. The tables' owner keeps CREATE (it runs
-- `db upgrade`). Other applications' owners sharing this database lose the PUBLIC grant too:
-- grant it back to them by name (a warning says so). Only the schema's owner or a superuser may
-- revoke PUBLIC's grant: otherwise the script says what to run, and goes on.
DO $$
DECLARE
  owner_role name := (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass('runs'));
  schema_name name := current_schema();
BEGIN
  IF owner_role IS NULL OR NOT has_schema_privilege('public', schema_name, 'CREATE') THEN
    RETURN;
  END IF;
  EXECUTE format('GRANT CREATE ON SCHEMA %I TO %I', schema_name, owner_role);
  EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC', schema_name);
  IF has_schema_privilege('public', schema_name, 'CREATE') THEN
    RAISE WARNING 'agent-watchdog: every login may still CREATE in schema %: as its owner or a superuser, run REVOKE CREATE ON SCHEMA % FROM PUBLIC;',
                  schema_name, quote_ident(schema_name);
  ELSE
    RAISE WARNING 'agent-watchdog: revoked CREATE ON SCHEMA % FROM PUBLIC (kept for %): grant it back by name to any other application''s owner in this database',
                  schema_name, owner_role;
  END IF;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE WARNING 'agent-watchdog: every login may CREATE in schema %: as its owner or a superuser, run REVOKE CREATE ON SCHEMA % FROM PUBLIC;',
                schema_name, quote_ident(schema_name);
END $$;

-- Start from nothing on every table of the store, then grant exactly what the SDK runs.
-- The store's tables, named (the database may hold other applications' tables too); a table a
-- later revision adds joins this list with its grants.
\set aw_tables 'runs, events, interventions, alerts, tool_circuits, circuit_probes, settings, daemons, attestations, spend_ledger, agent_rollups, agent_rollup_tools, alembic_version'
REVOKE ALL ON :aw_tables FROM PUBLIC, :"agents_role", :"gateway_role", :"viewer_role";
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM PUBLIC, :"agents_role", :"gateway_role", :"viewer_role";
GRANT USAGE ON SCHEMA public TO :"agents_role", :"gateway_role", :"viewer_role";
REVOKE CREATE ON SCHEMA public FROM :"agents_role", :"gateway_role", :"viewer_role";

-- Runs: register, read the status back, update only the columns the SDK writes.
-- Row-level security (revision 0010) narrows all of it to the login's own runs.
GRANT SELECT, INSERT ON runs TO :"agents_role";
-- (parent_id: a child run names its parent once, at start; paused_at: its guard pauses it; partial:
-- run.partial(). Never its budgets or `resumes`: only `agent-watchdog resume` raises those.)
GRANT UPDATE (steps, tool_calls, tool_errors, tokens_in, tokens_out, cost_eur, cached_tokens_in, reasoning_tokens,
              cost_unpriced_tokens, last_seq, last_seen_at, progress,
              status, stop_reason, stop_detail, stop_requested_at, ended_at, parent_id, paused_at, partial)
   ON runs TO :"agents_role";

-- Events: insert only (other runs' events are not an agent's to read), every column but the id:
-- the daemon reads the events above the newest id it folded, so an id a writer chose (the largest
-- bigint) would hide every later event from it; the id is the sequence's, through the default.
-- Nor stored_at (revision 0015: the day partition a row lands in): the server's now(), so no
-- writer aims its rows at a day that retention drops first.
SELECT format('GRANT INSERT (%s) ON events TO %I', string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position),
              :'agents_role')
  FROM information_schema.columns
 WHERE table_schema = current_schema() AND table_name = 'events' AND column_name NOT IN ('id', 'stored_at') \gexec
SELECT format('GRANT USAGE ON SEQUENCE %s TO %I', pg_get_serial_sequence('events', 'id'), :'agents_role') \gexec
-- What `agent-watchdog hook` reads back of its own session's calls (row-level security keeps it to
-- its own runs): how often this call was made (loops), the last ones (oscillation), the call ids
-- a log export counted already (one call, one count). Never their arguments, errors or costs.
GRANT SELECT (run_id, seq, kind, tool, args_hash, call_id) ON events TO :"agents_role";

-- What the daemon publishes, read only.
GRANT SELECT ON settings, tool_circuits TO :"agents_role";

-- The half-open probe: the first INSERT of (tool, opened_at) wins it, and the winner marks it
-- ok when its call succeeded (the SDK then lets calls through); the daemon judges it from the events.
GRANT SELECT, INSERT ON circuit_probes TO :"agents_role";
GRANT UPDATE (ok) ON circuit_probes TO :"agents_role";

-- The gateway: the same grants for its own runs (row-level security keeps its UPDATEs to them);
-- its policies below let it read every run and append witnessed events to any.
GRANT SELECT, INSERT ON runs TO :"gateway_role";
GRANT UPDATE (steps, tool_calls, tool_errors, tokens_in, tokens_out, cost_eur, cached_tokens_in, reasoning_tokens,
              cost_unpriced_tokens, last_seq, last_seen_at, progress,
              status, stop_reason, stop_detail, stop_requested_at, ended_at, parent_id, paused_at, partial)
   ON runs TO :"gateway_role";
SELECT format('GRANT INSERT (%s) ON events TO %I', string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position),
              :'gateway_role')
  FROM information_schema.columns
 WHERE table_schema = current_schema() AND table_name = 'events' AND column_name NOT IN ('id', 'stored_at') \gexec
SELECT format('GRANT USAGE ON SEQUENCE %s TO %I', pg_get_serial_sequence('events', 'id'), :'gateway_role') \gexec
GRANT SELECT ON settings, tool_circuits TO :"gateway_role";
GRANT SELECT, INSERT ON circuit_probes TO :"gateway_role";
GRANT UPDATE (ok) ON circuit_probes TO :"gateway_role";

-- The viewer: read everything the CLI's views and `web` show, write nothing. Attestations
-- without their MACs (nothing a view shows).
GRANT SELECT ON :aw_tables TO :"viewer_role";
REVOKE SELECT ON attestations FROM :"viewer_role";
GRANT SELECT (run_id, host, pid, pid_create_time, uid, kill_mode, attested_at, cgroup) ON attestations
   TO :"viewer_role";

-- Its witnessed events are numbered from watchdog.store.joined.WITNESS_SEQ_BASE (2^30) up, above
-- the run's own writer's 1, 2, ...: it reads those numbers of any run (the next one is its), and
-- only them: never what another writer recorded (arguments' hashes, error texts).
SELECT format('GRANT SELECT (run_id, seq) ON events TO %I', :'gateway_role') \gexec

-- Row-level security beyond "own runs only" (revision 0010's policies, for every confined role):
-- one policy per role, named after it, dropped and made again (the script is idempotent).
\set aw_witness_seq 1073741824
SELECT format('DROP POLICY IF EXISTS %I ON %I', name, tab)
  FROM (VALUES ('aw_gateway_reads_' || :'gateway_role', 'runs'), ('aw_gateway_witness_' || :'gateway_role', 'events'),
               ('aw_gateway_numbers_' || :'gateway_role', 'events'), ('aw_witness_range_' || :'agents_role', 'events'),
               ('aw_witness_range_' || :'gateway_role', 'events'),
               ('aw_viewer_reads_' || :'viewer_role', 'runs'), ('aw_viewer_reads_' || :'viewer_role', 'events'))
       AS p(name, tab) \gexec
SELECT format('CREATE POLICY %I ON runs FOR SELECT TO %I USING (true)',
              'aw_gateway_reads_' || :'gateway_role', :'gateway_role') \gexec
-- Any run's: only marked with its source, only in the witnesses' range (a number below it is the
-- run's writer's, whose record would then be refused as a duplicate: the gateway would blind it).
SELECT format('CREATE POLICY %I ON events FOR INSERT TO %I WITH CHECK (source = ANY (%L::text[]) AND seq >= %s)',
              'aw_gateway_witness_' || :'gateway_role', :'gateway_role',
              string_to_array(:'gateway_sources', ','), :aw_witness_seq) \gexec
SELECT format('CREATE POLICY %I ON events FOR SELECT TO %I USING (seq >= %s)',
              'aw_gateway_numbers_' || :'gateway_role', :'gateway_role', :aw_witness_seq) \gexec
-- Restrictive: the witnesses' range is the gateways' alone, also in a confined role's own runs (an
-- agent that took 2^31 - 1 there would leave its gateways no number: its calls recorded nowhere).
SELECT format('CREATE POLICY %I ON events AS RESTRICTIVE FOR INSERT TO %I WITH CHECK (seq < %s)',
              'aw_witness_range_' || :'agents_role', :'agents_role', :aw_witness_seq) \gexec
SELECT format('CREATE POLICY %I ON events AS RESTRICTIVE FOR INSERT TO %I WITH CHECK (seq < %s OR source = ANY (%L::text[]))',
              'aw_witness_range_' || :'gateway_role', :'gateway_role', :aw_witness_seq,
              string_to_array(:'gateway_sources', ',')) \gexec
SELECT format('CREATE POLICY %I ON %I FOR SELECT TO %I USING (true)', 'aw_viewer_reads_' || :'viewer_role', tab,
              :'viewer_role')
  FROM unnest(ARRAY['runs', 'events']) AS tab \gexec

COMMIT;
