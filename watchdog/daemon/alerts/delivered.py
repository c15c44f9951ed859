"""What the daemon itself delivered, checked before each send (issue 20).

`alerts.delivered_at` / `delivered_targets` are store columns any SQLite writer can reset:
reset, a genuine sealed alert would go out again on each reset. The daemon records each
(alert, target) it delivered in its state file (watchdog.store.memory) and never sends one
twice; the alert's key is its dedupe key and its sealed creation time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from watchdog.core.rowviews import AlertKeyView

if TYPE_CHECKING:
    from watchdog.daemon.alerts.notify import Target
    from watchdog.store.memory import Memory

log = logging.getLogger("watchdog.outbox")


def _key(dedupe_key: str, created_at: object) -> str:
    stamp = created_at.isoformat() if hasattr(created_at, "isoformat") else str(created_at)
    return f"{dedupe_key}@{stamp}"


def already(memory: Memory | None, row: AlertKeyView, targets: Iterable[Target]) -> set[str]:
    """The ids of the targets this daemon delivered this alert to (none without a memory)."""
    if memory is None:
        return set()
    key = _key(row.dedupe_key, row.created_at)
    try:
        return {t.id for t in targets if memory.delivered(key, t.id)}
    except Exception:  # noqa: BLE001 — the store's own record still holds
        log.warning("could not read the daemon's delivery record", exc_info=True)
        return set()


def sent(memory: Memory | None, dedupe_key: str, created_at: object, target_id: str) -> None:
    if memory is None:
        return
    try:
        memory.deliver(_key(dedupe_key, created_at), target_id)
    except Exception:  # noqa: BLE001 — at least once: the store's record still says delivered
        log.warning("could not write the daemon's delivery record", exc_info=True)
