"""The pre-filter over light rows (watchdog.daemon.tick.prefilter): which runs the tick evaluates whole,
what it sums for the period budgets, the first sights it records. Pure: light rows built here."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from watchdog.core.config import parse
from watchdog.daemon.trust.scan import Defect, L, LIGHT
from watchdog.daemon.money.money import Money
from watchdog.daemon.tick.prefilter import PreFilter

T0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)
NOW_S = T0.timestamp()


def light(rid: str, **values) -> tuple:
    row = dict.fromkeys(LIGHT)
    row.update(id=rid, agent="bot", status="running", host="h1", pid=None, pid_create_time=None, resumes=0,
               steps=1, tool_calls=1, cost_eur=0.1, tokens=10, started_s=NOW_S - 10, seen_s=NOW_S - 1)
    row.update(values)
    return tuple(row[k] for k in LIGHT)


def due(cfg, rows, *, spend=None, defects=None, **kw) -> list[str]:
    args = dict(stats={}, host="h1", judged=None, resume_seen=set(), skip_clock=False,
                defects=[] if defects is None else defects)
    args.update(kw)
    return PreFilter(cfg).due(rows, T0, None, spend, **args)


def test_healthy_runs_are_skipped_and_each_breach_is_due():
    cfg = parse({})
    rows = [light("ok"), light("steps", steps=13), light("old", started_s=NOW_S - 400),
            light("silent", seen_s=NOW_S - 200), light("stopping", status="stopping"),
            light("own", steps=3, max_steps=2)]
    assert due(cfg, rows) == ["steps", "old", "silent", "stopping", "own"]
    # The clock just jumped: durations are not judged; counters are.
    assert due(cfg, rows, skip_clock=True) == ["steps", "stopping", "own"]


def test_a_malformed_row_is_a_defect_of_its_run_only():
    defects: list[Defect] = []
    rows = [light("nan", cost_eur=float("nan")), light("text", steps="many"), light("ok")]
    assert due(parse({}), rows, defects=defects) == []
    assert [d.run_id for d in defects] == ["nan", "text"]


def test_first_sight_is_recorded_once_and_bounds_the_age():
    first = {"known": NOW_S - 400}  # seen 400 s ago although its row says it started 10 s ago
    seen: list = []
    rows = [light("known"), light("new", parent_id="p")]
    assert due(parse({}), rows, first=first, new_seen=seen) == ["known"]
    assert seen == [("new", NOW_S, "p")]


def test_the_events_count_when_the_row_shows_less():
    tally = SimpleNamespace(values=[5, 1, 0, 10, 0.1])  # steps, calls, errors, tokens, cost
    assert due(parse({}), [light("r")], evidence={"r": tally}) == ["r"]
    same = SimpleNamespace(values=[1, 1, 0, 10, 0.1])
    assert due(parse({}), [light("r")], evidence={"r": same}) == []


def test_another_hosts_run_is_only_summed():
    cfg = parse({})
    spend = Money(cfg, "t").live_spend()
    rows = [light("mine", steps=99), light("theirs", host="h2", steps=99)]
    assert due(cfg, rows, spend=spend, judged=frozenset({"h1"})) == ["mine"]
    assert abs(spend.per_agent["bot"] - 0.2) < 1e-9 and spend.new == []  # no [[budgets]]: no labels read


def test_label_budgets_sum_the_covered_runs_and_ask_for_the_new_ones():
    cfg = parse({"budgets": [{"labels": {"tenant": "acme"}, "max_cost_eur_per_day": 1.0}]})
    money = Money(cfg, "t")
    money.run_scopes = {"a": ("acme",), "b": ()}
    spend = money.live_spend()
    due(cfg, [light("a", cost_eur=0.3), light("b", cost_eur=0.4), light("c", cost_eur=0.5)], spend=spend)
    assert dict(spend.labelled) == {"acme": 0.3} and spend.new == [("c", 0.5)]
    assert abs(spend.per_agent["bot"] - 1.2) < 1e-9


def test_a_profile_with_owners_is_due_until_its_owner_is_checked_then_judged_by_defaults_if_refused():
    cfg = parse({"defaults": {"max_steps": 12}, "agents": {"bot": {"max_steps": 1000, "owners": ["ops"]}}})
    rows = [light("r", steps=50)]
    assert due(cfg, rows, owner_ok=lambda rid: None) == ["r"]  # not checked yet
    assert due(cfg, rows, owner_ok=lambda rid: True) == []  # its profile's 1000 steps
    assert due(cfg, rows, owner_ok=lambda rid: False) == ["r"]  # [defaults]' 12


def test_a_resume_not_yet_announced_is_due():
    rows = [light("r", resumes=1)]
    assert due(parse({}), rows) == ["r"]
    assert due(parse({}), rows, resume_seen={("r", 1)}) == []


def test_a_run_on_this_host_whose_process_is_gone_is_due():
    rows = [light("r", pid=4242, pid_create_time=1.0)]
    assert PreFilter(parse({})).due(rows, T0, {1}, None, stats={}, host="h1", judged=None, resume_seen=set(),
                                    skip_clock=False, defects=[]) == ["r"]
    assert PreFilter(parse({})).due(rows, T0, {4242}, None, stats={}, host="h1", judged=None, resume_seen=set(),
                                    skip_clock=False, defects=[]) == []
    assert L["pid"] == LIGHT.index("pid")
