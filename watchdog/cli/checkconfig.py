"""`agent-watchdog check-config`: validate what `agent-watchdog run` will use (issue 19, item 5).

The alert URLs are read as the daemon reads them: `[alerts] urls`, then `urls_file` (relative
to $CREDENTIALS_DIRECTORY under the unit, else next to the config), each loaded by apprise
(an unknown scheme or a bad token is refused: exit 2). A URL is only ever printed in apprise's
privacy form (secrets masked). A credential file this user cannot read is named with the
fix; one that every user can read gets a warning. One line per profile: `[defaults]` in full
(wrapped), each agent's profile as its differences from `[defaults]`.
"""

from __future__ import annotations

import getpass
import os
import stat
import textwrap

from watchdog.core.budgets import PROFILE_KEYS
from watchdog.core.config import ENV_CREDENTIALS, Config, alert_urls
from watchdog.core.text import url_without_password
from watchdog.errors import ConfigError

WIDTH = 100
OWN_USER = "(the daemon's own user, if a regular one)"


def urls_file_path(config: Config) -> str | None:
    value = config.alert_urls_file
    if not value:
        return None
    if not os.path.isabs(value):
        base = os.environ.get(ENV_CREDENTIALS) or os.path.dirname(os.path.abspath(config.path or "."))
        value = os.path.join(base, value)
    return value


def checked_urls(config: Config) -> tuple[list[str], list[str]]:
    """(every alert URL in privacy form, warnings); ConfigError (one line) for a bad one."""
    from watchdog.daemon.alerts.notify import Notifier, url_error

    path = urls_file_path(config)
    warnings = []
    if path is not None:
        try:
            st = os.stat(path)
        except OSError as exc:
            who = f"this user ({getpass.getuser()})"
            hint = (f"; {who} cannot read it: run check-config as root, who reads the credential file "
                    "as systemd hands it to the daemon (sudo agent-watchdog check-config)"
                    if isinstance(exc, PermissionError) else "")
            raise ConfigError(f"{config.path or '<config>'}: alerts.urls_file: cannot read {path} "
                              f"({exc.strerror}){hint}") from None
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{config.path or '<config>'}: alerts.urls_file: this user ({getpass.getuser()}) "
                              f"cannot read {path}: run check-config as root, who reads the credential file "
                              "as systemd hands it to the daemon (sudo agent-watchdog check-config)")
        if st.st_mode & stat.S_IROTH:
            warnings.append(f"warning: alerts.urls_file {path} is readable by every user (it holds the alert "
                            f"credentials): chmod o-r {path}")
    urls = alert_urls(config, url_error=url_error)
    for i, u in enumerate(config.alert_urls):
        reason = url_error(u)
        if reason:  # load() checked them too; said again by position, never by value
            raise ConfigError(f"{config.path or '<config>'}: alerts.urls[{i}]: {reason}")
    try:
        targets = Notifier(urls).targets
    except ValueError as exc:
        raise ConfigError(f"{config.path or '<config>'}: alerts: {exc}") from None
    return [t.privacy_url for t in targets], warnings


def open_profiles(config: Config, url: str | None) -> list[str]:
    """On PostgreSQL, one warning per agent profile without `owners`: open, so any login's runs
    named after it count toward its budgets (issue 32; on SQLite every writer is one trust domain)."""
    if not (url or "").startswith("postgresql"):
        return []
    return [f"warning: agents.{name}.owners is not set: any login's runs named {name} count toward its budgets "
            f"(set owners = [\"<login>\", ...])" for name, b in config.agents.items() if not getattr(b, "owners", ())]


def summary(config: Config, shown_urls: list[str], warnings: list[str]) -> str:
    d = config.daemon
    n_file = len(shown_urls) - len(config.alert_urls)
    lines = [f"config {config.path or '(built-in defaults)'}: OK",
             f"  store {url_without_password(config.store.url) or '(from --db / AGENT_WATCHDOG_DB)'}",
             f"  daemon tick {d.tick_s:g}s, cancel grace {d.cancel_grace_s:g}s, term grace {d.term_grace_s:g}s",
             f"  allowed users {', '.join(d.allowed_users) or OWN_USER}",
             f"  state_dir {d.state_dir}", f"  socket {d.socket}", f"  key_file {d.key_file}",
             f"  alerts {len(shown_urls)} URL(s)" + (f" ({max(0, n_file)} from urls_file)" if config.alert_urls_file
                                                   else "")]
    lines += [f"    {u}" for u in shown_urls]
    lines += [f"  {w}" for w in warnings]
    lines.append(f"  prices: overrides for {len(config.prices)} model(s), genai-prices at "
                 f"{config.pricing.eur_per_usd:g} EUR/USD, budget_tz {config.pricing.budget_tz}")
    lines.append(f"  drift window {config.drift.window_s:g}s vs {config.drift.baseline_days:g} days, factor "
                 f"{config.drift.factor:g}, min runs {config.drift.min_runs}; {len(config.budgets)} label budget(s)")
    base = config.defaults
    full = " ".join(f"{k}={getattr(base, k)}" for k in PROFILE_KEYS)
    lines += textwrap.wrap(f"[defaults] {full}", WIDTH - 2, initial_indent="  ", subsequent_indent="      ")
    for name, b in config.agents.items():
        own = [f"{k}={getattr(b, k)}" for k in PROFILE_KEYS if getattr(b, k) != getattr(base, k)]
        lines.append(f"  [agents.{name}] " + (" ".join(own) + "; the rest as [defaults]" if own
                                              else "as [defaults]"))
    for lb in config.budgets:
        lines.append(f"  [[budgets]] labels {lb.name}: per day {lb.max_cost_eur_per_day:g}, "
                     f"per month {lb.max_cost_eur_per_month:g} EUR, warn_at {lb.warn_at:g}")
    return "\n".join(lines)
