"""What the pages and /api/ read: one read-only snapshot per request, through the store's named verbs.

The JSON is exactly the CLI's: `runs --json` records (watchdog.store.views.list_runs) and
`show --json` (run_detail), so a script may switch between them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from watchdog.core import lifecycle as lc, timeline_svg
from watchdog.core.config import Config
from watchdog.core.periods import zone, utcnow
from watchdog.core.postmortem import render as render_postmortem
from watchdog.errors import StoreError
from watchdog.store import views, viewer
from watchdog.store.engine import Connection, Engine, read_connection
from watchdog.store.ledger import period_report
from watchdog.web import pages
from watchdog.web.markdown import to_html

PAGE_RUNS = 100  # ended runs per page of the runs page
ACTIVE_RUNS = 500  # active runs shown at most (there are rarely more)


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


def next_query(query: dict, before: str) -> str:
    return urlencode({**{k: v for k, v in query.items() if k != "before"}, "before": before})


def _label(filters: dict[str, str]) -> dict[str, str] | None:
    if "label" not in filters:
        return None
    key, _, value = filters["label"].partition("=")
    return {key.strip(): value.strip()}


class Views:
    def __init__(self, engine: Engine, config: Config, *, config_from_file: bool, owner: str | None = None):
        self.engine = engine
        self.config = config
        self.config_from_file = config_from_file
        # --owner: every read is of that owner's runs; another owner's run id is a 404.
        self.owner = owner

    def banner(self) -> str | None:
        """"no live daemon since …" when no daemon's lease is live: the page's STOP marks may be stale."""
        with read_connection(self.engine) as conn:
            live = views.daemon_liveness(conn)
        if live.alive:
            return None
        if live.last_tick_at is None:
            return "no live daemon: none has ticked on this store; runs are watched by nobody"
        since = live.last_tick_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"no live daemon since {since}: runs are not being watched, the numbers may be stale"

    def _judge_by(self, conn: Any) -> Config:
        return self.config if self.config_from_file else views.published_profiles(conn, self.config)

    def _resolve(self, conn: Connection, run_id: str) -> str:
        try:
            return views.resolve_run_id(conn, run_id, owner=self.owner)
        except StoreError as exc:
            raise NotFound(str(exc)) from None

    def _list(self, conn: Connection, filters: dict[str, str], *, statuses, limit: int, before: str | None) -> list[dict]:
        if before is not None:
            before = self._resolve(conn, before)
        wanted = filters.get("status")
        if wanted:
            if wanted not in lc.STATUSES:
                raise BadRequest(f"status: one of {', '.join(lc.STATUSES)}")
            statuses = [s for s in statuses if s == wanted] if statuses is not None else [wanted]
        return views.list_runs(conn, self._judge_by(conn), utcnow(), all_runs=True, limit=limit, before=before,
                               statuses=statuses, agent=filters.get("agent"), host=filters.get("host"),
                               labels=_label(filters), owner=self.owner)

    def runs_json(self, filters: dict[str, str], *, all_runs: bool, limit: int,
                  before: str | None) -> tuple[list[dict], str | None]:
        with read_connection(self.engine) as conn:
            records = self._list(conn, filters, statuses=None if all_runs else list(lc.ACTIVE_STATUSES),
                                 limit=limit + 1, before=before)
        more = len(records) > limit
        records = records[:limit]
        return records, (records[-1]["id"] if more and records else None)

    def runs_html(self, filters: dict[str, str], before: str | None) -> str:
        with read_connection(self.engine) as conn:
            active = [] if before else self._list(conn, filters, statuses=list(lc.ACTIVE_STATUSES),
                                                  limit=ACTIVE_RUNS, before=None)
            recent = self._list(conn, filters, statuses=list(lc.END_STATUSES), limit=PAGE_RUNS + 1, before=before)
        more = len(recent) > PAGE_RUNS
        recent = recent[:PAGE_RUNS]
        # The first page refreshes from the newest runs; an older page shows ended runs: nothing to refresh.
        api = None if before else "/api/runs?" + urlencode({**filters, "limit": ACTIVE_RUNS + PAGE_RUNS})
        return pages.runs_page(active, recent, filters, next_before=recent[-1]["id"] if more else None, api=api)

    def run_json(self, run_id: str, last_events: int = 15) -> dict:
        with read_connection(self.engine) as conn:
            rid = self._resolve(conn, run_id)
            return views.run_detail(conn, rid, self._judge_by(conn), utcnow(), last_events=last_events,
                                     owner=self.owner)

    def _svg(self, conn: Connection, record: dict, now: dt.datetime) -> str:
        calls, spend = viewer.timeline(conn, record["id"])
        start = dt.datetime.fromisoformat(record["started_at"])
        end = dt.datetime.fromisoformat(record["ended_at"]) if record["ended_at"] else now
        return timeline_svg.render(calls, spend, start, end,
                                   title=f"{record['agent']} run {record['id'][:8]}: tool calls over time")

    def run_html(self, run_id: str) -> str:
        now = utcnow()
        with read_connection(self.engine) as conn:
            rid = self._resolve(conn, run_id)
            record = views.run_detail(conn, rid, self._judge_by(conn), now, last_events=0, owner=self.owner)
            svg = self._svg(conn, record, now)
            alerts = viewer.run_alerts(conn, rid)
        return pages.run_page(record, svg=svg, alerts=alerts)

    def timeline_svg(self, run_id: str) -> str:
        now = utcnow()
        with read_connection(self.engine) as conn:
            rid = self._resolve(conn, run_id)
            record = views.run_detail(conn, rid, self._judge_by(conn), now, last_events=0, owner=self.owner)
            return self._svg(conn, record, now)

    def postmortem_md(self, run_id: str, *, timeline_file: str | None = None) -> tuple[str, str]:
        now = utcnow()
        with read_connection(self.engine) as conn:
            rid = self._resolve(conn, run_id)
            facts = viewer.postmortem_facts(conn, rid, now, owner=self.owner)
            return rid, render_postmortem(facts, self._judge_by(conn), now, timeline_file=timeline_file)

    def postmortem_html(self, run_id: str) -> str:
        rid, md = self.postmortem_md(run_id, timeline_file="timeline.svg")
        with read_connection(self.engine) as conn:
            agent = views.load_run(conn, rid).agent
        return pages.postmortem_page(rid, agent, to_html(md, image_src=f"/runs/{rid}/timeline.svg"))

    def _periods(self) -> tuple[list, dt.datetime, Config]:
        if self.owner is not None:  # an agent's spend adds up every owner's runs: not one owner's to see
            raise NotFound("period budgets sum every owner's runs: not shown with --owner")
        now = utcnow()
        with read_connection(self.engine) as conn:
            config = self._judge_by(conn)
            return period_report(conn, config, now, viewer.published_state(conn, now)), now, config

    def budgets_html(self) -> str:
        states, now, config = self._periods()
        return pages.budgets_page(states, now, zone(config.pricing.budget_tz))

    def budgets_json(self) -> list[dict]:
        return [s.to_json() for s in self._periods()[0]]
