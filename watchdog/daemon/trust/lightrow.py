"""A run's light row read by name: the one place off the pre-filter's pass that knows its positions.

The tick reads every active run as a light row (watchdog.store.scan.LIGHT), a bare tuple on
PostgreSQL's fast read and a Row by position elsewhere: the pre-filter's pass over all of them
indexes it for speed (`L`). The rare paths (the backstop of unreadable runs, the runs a closed
period budget covers, a bad cost summed again) read it through `Light`, so that they name the columns they rely on and mypy checks their types where they are used.
Values are as stored: a quarantined row's need not be of the types named (its readers check).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from watchdog.store.scan import L

_ID, _AGENT, _STATUS, _HOST = L["id"], L["agent"], L["status"], L["host"]
_PID, _CTIME, _COST = L["pid"], L["pid_create_time"], L["cost_eur"]


# A light row as the store hands it: its values by position (watchdog.store.scan.LIGHT).
LightRow = Sequence[Any]

# One column of every active run, by name at C speed (a pass over all of them while a period
# budget is spent: no object per row). Typed by what the column holds.
run_id: Callable[[LightRow], str] = itemgetter(_ID)
agent_of: Callable[[LightRow], str] = itemgetter(_AGENT)
status_of: Callable[[LightRow], str] = itemgetter(_STATUS)
host_of: Callable[[LightRow], str] = itemgetter(_HOST)
proc_of: Callable[[LightRow], tuple[str, int | None]] = itemgetter(_HOST, _PID)  # the run's (host, pid)


class Light:
    """A light row by name; one small object per row read."""

    __slots__ = ("_r",)

    def __init__(self, row: LightRow) -> None:
        self._r = row

    @property
    def id(self) -> str:
        found: str = self._r[_ID]
        return found

    @property
    def agent(self) -> str:
        found: str = self._r[_AGENT]
        return found

    @property
    def status(self) -> str:
        found: str = self._r[_STATUS]
        return found

    @property
    def host(self) -> str:
        found: str = self._r[_HOST]
        return found

    @property
    def pid(self) -> int | None:
        found: int | None = self._r[_PID]
        return found

    @property
    def pid_create_time(self) -> float | None:
        found: float | None = self._r[_CTIME]
        return found

    @property
    def cost_eur(self) -> float:
        found: float = self._r[_COST]
        return found


