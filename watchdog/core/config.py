"""TOML configuration into frozen dataclasses.

Every error is a ConfigError with one line naming the file, the key and what
was expected. The key names are public (DESIGN.md); `systemd/config.example.toml`
annotates each of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence, overload

from watchdog.core import paths
from watchdog.core.budgets import PROFILE_KEYS, RUN_BUDGET_KEYS, Budgets, profile_from_json, validate_profile_value
from watchdog.core.drift import DriftConfig
from watchdog.core.periods import LabelBudget, WARN_AT, zone
from watchdog.core.pricing import PRICE_KEYS, REQUIRED_PRICE_KEYS, Price, PricingConfig
from watchdog.core.lifecycle import RECORD_ERRORS_CHOICES
from watchdog.core.text import url_scheme_only
from watchdog.errors import ConfigError

__all__ = ["Budgets", "RUN_BUDGET_KEYS", "Config", "load", "parse", "resolve_db_url"]

# Why an alert URL cannot be used, or None (watchdog.daemon.alerts.notify.url_error).
UrlCheck = Callable[[str], "str | None"]

ENV_CONFIG = "AGENT_WATCHDOG_CONFIG"
ENV_DB = "AGENT_WATCHDOG_DB"
# Where systemd's LoadCredential= puts the unit's credentials (a relative urls_file is read there).
ENV_CREDENTIALS = "CREDENTIALS_DIRECTORY"
DEFAULT_SOCKET = "/run/agent-watchdog/attest.sock"  # RuntimeDirectory= of the unit
DEFAULT_KEY_FILE = "/var/lib/agent-watchdog/attest.key"  # StateDirectory= of the unit
@dataclass(frozen=True)
class StoreConfig:
    url: str | None = None
    # Both are read by whoever reads THIS file (an agent's own config, or the daemon
    # for what it copies into alerts and circuits); never published, never read from the store.
    record_args: bool = False
    record_errors: str = "scrubbed"  # or "class": no message text at all
    keep_days: float = 30.0  # ended runs older than this are pruned by the leader; 0 = keep forever


@dataclass(frozen=True)
class DaemonConfig:
    tick_s: float = 5.0
    cancel_grace_s: float = 10.0
    term_grace_s: float = 5.0
    # empty = the daemon's own user, unless that is root (refused at start) or a system account (nobody)
    allowed_users: tuple[str, ...] = ()
    alert_retry_s: float = 30.0
    alert_expire_s: float = 86400.0  # an alert not delivered within this is dead-lettered, never retried
    # The daemon's own files (sealing key, lease lock per store, its state file); resolved by
    # watchdog.core.paths ($STATE_DIRECTORY, /var/lib/agent-watchdog as root, else per user).
    state_dir: str = field(default_factory=lambda: _paths().state_dir)
    socket: str = field(default_factory=lambda: _paths().socket)  # where agents attest their process identity
    key_file: str = field(default_factory=lambda: _paths().key_file)  # the sealing key, 0600, made at first start
    # issue 35: judging sharded by run id across the store's daemons (PostgreSQL): the number of
    # shards, the same on every daemon of the store; 0 (the key absent): each judges its host's runs
    shards: int = 0


@dataclass(frozen=True)
class ResolvedPaths:
    state_dir: str
    socket: str
    key_file: str


def resolve_paths(state_dir: str = "", socket: str = "", key_file: str = "",
                  env: Mapping[str, str] | None = None) -> ResolvedPaths:
    """[daemon] state_dir / socket / key_file as configured ("" = the default for this process)."""
    env = os.environ if env is None else env
    euid = os.geteuid()
    home = os.path.expanduser("~")
    state = paths.state_dir(state_dir, env, euid, home)
    return ResolvedPaths(state, paths.daemon_socket(socket, env, euid, state), paths.key_file(key_file, state))


def _paths() -> ResolvedPaths:
    return resolve_paths()


@dataclass(frozen=True)
class CircuitPolicy:
    errors: int = 5
    window_s: float = 60.0
    open_s: float = 120.0
    max_calls_per_min: int = 120  # calls of one tool over all runs; 0 = no alarm


@dataclass(frozen=True)
class CircuitConfig:
    default: CircuitPolicy = CircuitPolicy()
    tools: Mapping[str, CircuitPolicy] = field(default_factory=dict)

    def for_tool(self, tool: str) -> CircuitPolicy:
        return self.tools.get(tool, self.default)


# --- [otlp]: the daemon's OTLP/HTTP receiver (watchdog.daemon.otlp) -------------------------
OTLP_KILL_MODES = ("cooperative", "process")
OTLP_MAX_REQUEST_BYTES = 4 * 1024 * 1024  # after decompression; the OTel Collector's default is 20 MiB
OTLP_MAX_NEW_RUNS_PER_MIN = 120  # span-only runs one sender may start per minute


@dataclass(frozen=True)
class OtlpConfig:
    listen: str = ""  # "" = off; "127.0.0.1:4318" turns the receiver on
    # Runs seen only through spans: "cooperative" (stopped in the store and alerted, never
    # signalled) or "process" (signal the sender when the kernel confirms it is the claimed process.pid).
    kill_mode: str = "cooperative"
    max_request_bytes: int = OTLP_MAX_REQUEST_BYTES
    # Bearer tokens (`TOKEN agent=NAME[,NAME...] [owner=WHO]` per line; relative: in
    # $CREDENTIALS_DIRECTORY, else next to the config), read by the receiver at start.
    tokens_file: str = ""
    # Spans without a known token: refused (401), or counted only for runs the same sender
    # (the socket's owner uid) started, judged by [defaults], never for a named agent.
    allow_anonymous: bool = False
    max_new_runs_per_min: int = OTLP_MAX_NEW_RUNS_PER_MIN  # per sender; 429 past it


def _otlp(ctx: "_Ctx", table: Mapping[str, Any]) -> OtlpConfig:
    _check_keys(ctx, "otlp", table, ("listen", "kill_mode", "max_request_bytes", "tokens_file", "allow_anonymous",
                                     "max_new_runs_per_min"))
    listen = table.get("listen", "")
    if not isinstance(listen, str) or (listen and not _valid_listen(listen.replace("[", "").replace("]", ""))):
        raise ctx.fail("otlp.listen", 'a "host:port" string such as "127.0.0.1:4318" (or "" for off)', listen)
    kill_mode = table.get("kill_mode", "cooperative")
    if kill_mode not in OTLP_KILL_MODES:
        raise ctx.fail("otlp.kill_mode", 'one of "cooperative", "process"', kill_mode)
    size = table.get("max_request_bytes", OTLP_MAX_REQUEST_BYTES)
    size = _number(ctx, "otlp.max_request_bytes", size, integer=True)
    if size < 1024:
        raise ctx.fail("otlp.max_request_bytes", "an integer >= 1024 (bytes, after decompression)", size)
    tokens_file = table.get("tokens_file", "")
    if not isinstance(tokens_file, str):
        raise ctx.fail("otlp.tokens_file", "a file name (relative: in $CREDENTIALS_DIRECTORY) or an absolute path",
                       tokens_file)
    anonymous = _bool(ctx, "otlp.allow_anonymous", table.get("allow_anonymous", False))
    new_runs = _number(ctx, "otlp.max_new_runs_per_min", table.get("max_new_runs_per_min", OTLP_MAX_NEW_RUNS_PER_MIN),
                       integer=True)
    return OtlpConfig(listen=listen, kill_mode=kill_mode, max_request_bytes=size, tokens_file=tokens_file,
                      allow_anonymous=anonymous, max_new_runs_per_min=new_runs)
# --- end [otlp] ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    path: str | None = None
    store: StoreConfig = StoreConfig()
    daemon: DaemonConfig = DaemonConfig()
    defaults: Budgets = Budgets()
    agents: Mapping[str, Budgets] = field(default_factory=dict)
    circuit: CircuitConfig = CircuitConfig()
    alert_urls: tuple[str, ...] = ()
    alert_urls_file: str | None = None  # read by alert_urls(), when alerts are sent
    prices: Mapping[str, Price] = field(default_factory=dict)
    metrics_listen: str = ""
    pricing: PricingConfig = PricingConfig()
    budgets: tuple[LabelBudget, ...] = ()  # [[budgets]]: label-scoped period budgets
    drift: DriftConfig = DriftConfig()
    otlp: OtlpConfig = OtlpConfig()  # [otlp]

    def profile(self, agent: str) -> Budgets:
        return self.agents.get(agent, self.defaults)

    def published(self) -> dict[str, Any]:
        """What the daemon publishes in the store's settings table for the SDK and CLI."""
        return {
            "defaults": self.defaults.to_json(),
            "agents": {k: v.to_json() for k, v in self.agents.items()},
            "prices": {k: v.to_json() for k, v in self.prices.items()},
            # Not record_args nor record_errors: what an agent records is its own choice,
            # and a row anyone can write must not be able to turn it up.
            "tick_s": self.daemon.tick_s,
            "pricing": dataclasses.asdict(self.pricing),
            "budgets": [{"labels": dict(b.labels), "max_cost_eur_per_day": b.max_cost_eur_per_day,
                         "max_cost_eur_per_month": b.max_cost_eur_per_month, "warn_at": b.warn_at}
                        for b in self.budgets],
        }

    def with_published(self, value: Any) -> "Config":
        """This config judged by the profiles and prices a daemon published (`published()`),
        whatever a row written by hand holds: what cannot be read is left as it is here.
        The one reader of the published settings (the SDK and the CLI both use it)."""
        if not isinstance(value, dict):
            return self
        defaults = profile_from_json(value.get("defaults")) or self.defaults
        raw_agents = value.get("agents")
        if not isinstance(raw_agents, dict):
            raw_agents = {}
        agents = {name: b for name, raw in raw_agents.items()
                  if isinstance(name, str) and (b := profile_from_json(raw)) is not None}
        raw_prices = value.get("prices")
        if not isinstance(raw_prices, dict):
            raw_prices = {}
        prices = {m: pr for m, raw in raw_prices.items() if (pr := Price.from_json(raw)) is not None}
        tick_s = value.get("tick_s")
        daemon = self.daemon
        if isinstance(tick_s, (int, float)) and not isinstance(tick_s, bool) and 0 < tick_s < math.inf:
            daemon = dataclasses.replace(daemon, tick_s=float(tick_s))
        pricing = _published_pricing(value.get("pricing")) or self.pricing
        budgets = self.budgets
        if isinstance(value.get("budgets"), list):
            budgets = tuple(lb for raw in value["budgets"] if (lb := _published_label_budget(raw)) is not None)
        return dataclasses.replace(self, defaults=defaults, agents=agents, prices=prices or self.prices,
                                   daemon=daemon, pricing=pricing, budgets=budgets)


def _published_pricing(raw: object) -> PricingConfig | None:
    if not isinstance(raw, dict):
        return None
    rate, tz = raw.get("eur_per_usd"), raw.get("budget_tz")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0 < rate < math.inf):
        return None
    try:
        zone(tz) if isinstance(tz, str) else None
    except ValueError:
        return None
    return PricingConfig(float(rate), tz) if isinstance(tz, str) else None


def _published_label_budget(raw: object) -> LabelBudget | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("labels"), dict) or not raw["labels"]:
        return None
    labels = raw["labels"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return None
    values = {}
    for key in ("max_cost_eur_per_day", "max_cost_eur_per_month", "warn_at"):
        v = raw.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < math.inf):
            return None
        values[key] = float(v)
    if not 0 < values["warn_at"] <= 1:
        return None
    return LabelBudget(dict(labels), max_cost_eur_per_day=values["max_cost_eur_per_day"],
                       max_cost_eur_per_month=values["max_cost_eur_per_month"], warn_at=values["warn_at"])


# --- parsing ------------------------------------------------------------------


class _Ctx:
    def __init__(self, path: str):
        self.path = path

    def fail(self, key: str, expected: str, got: object = dataclasses.MISSING) -> ConfigError:
        got_txt = "" if got is dataclasses.MISSING else f", got {got!r}"
        return ConfigError(f"{self.path}: {key}: expected {expected}{got_txt}")


def _check_keys(ctx: _Ctx, section: str, table: Mapping[str, Any], allowed: Sequence[str]) -> None:
    for key in table:
        if key not in allowed:
            name = f"{section}.{key}" if section else key
            near = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
            if near:  # a typo: name the key that was meant
                raise ConfigError(f"{ctx.path}: {name}: unknown key; did you mean {near[0]!r}?")
            known = ", ".join(sorted(allowed))
            raise ctx.fail(name, f"one of the known keys ({known})", "unknown key")


def _table(ctx: _Ctx, raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ctx.fail(f"[{key}]", "a table", value)
    return value


@overload
def _number(ctx: _Ctx, key: str, value: object, *, integer: Literal[True], positive: bool = True,
            allow_zero: bool = False) -> int: ...


@overload
def _number(ctx: _Ctx, key: str, value: object, *, integer: Literal[False] = False, positive: bool = True,
            allow_zero: bool = False) -> float: ...


@overload
def _number(ctx: _Ctx, key: str, value: object, *, integer: bool, positive: bool = True,
            allow_zero: bool = False) -> int | float: ...


def _number(ctx: _Ctx, key: str, value: object, *, integer: bool = False, positive: bool = True,
            allow_zero: bool = False) -> float:
    """`value` checked as a finite number (an int with `integer`, else a float): ConfigError naming `key`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ctx.fail(key, "an integer" if integer else "a number", value)
    if integer and not isinstance(value, int):
        raise ctx.fail(key, "an integer", value)
    if not math.isfinite(value):  # TOML has nan and inf: a NaN budget would never trip
        raise ctx.fail(key, "a finite number", value)
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        raise ctx.fail(key, "a number >= 0" if allow_zero else "a number > 0", value)
    return value if integer else float(value)


def _bool(ctx: _Ctx, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ctx.fail(key, "true or false", value)
    return value


def _budgets(ctx: _Ctx, section: str, table: Mapping[str, Any], base: Budgets) -> Budgets:
    _check_keys(ctx, section, table, PROFILE_KEYS)
    values: dict[str, Any] = {}  # a profile's fields: limits, choices, names
    for k, v in table.items():
        try:
            values[k] = validate_profile_value(k, v)
        except ValueError as exc:
            raise ConfigError(f"{ctx.path}: {section}.{k}: {exc}") from None
    return dataclasses.replace(base, **values)


def _circuit_policy(ctx: _Ctx, section: str, table: Mapping[str, Any], base: CircuitPolicy) -> CircuitPolicy:
    _check_keys(ctx, section, table, ("errors", "window_s", "open_s", "max_calls_per_min"))
    values: dict[str, Any] = {}  # counts (int) and seconds (float)
    for k, v in table.items():
        values[k] = _number(ctx, f"{section}.{k}", v, integer=(k in ("errors", "max_calls_per_min")),
                            allow_zero=(k == "max_calls_per_min"))
    return dataclasses.replace(base, **values)


SECTIONS = ("store", "daemon", "defaults", "agents", "circuit", "alerts", "prices", "metrics", "pricing", "budgets",
            "drift", "otlp")


def parse(raw: Mapping[str, Any], path: str = "<config>", *, url_error: UrlCheck | None = None) -> Config:
    """The config of a TOML document's tables; the first thing wrong raises ConfigError (the
    sections are checked in this order, so a file with several mistakes always names the same)."""
    ctx = _Ctx(path)
    _check_keys(ctx, "", raw, SECTIONS)
    store = _store(ctx, _table(ctx, raw, "store"))
    daemon = _daemon(ctx, _table(ctx, raw, "daemon"))
    defaults = _budgets(ctx, "defaults", _table(ctx, raw, "defaults"), Budgets())
    agents = _agents(ctx, _table(ctx, raw, "agents"), defaults)
    circuit = _circuit(ctx, _table(ctx, raw, "circuit"))
    urls, urls_file = _alerts(ctx, _table(ctx, raw, "alerts"), url_error)
    prices = _prices(ctx, _table(ctx, raw, "prices"))
    pricing = _pricing(ctx, _table(ctx, raw, "pricing"))
    label_budgets = _label_budgets(ctx, raw.get("budgets", []))
    drift = _drift(ctx, _table(ctx, raw, "drift"))
    listen = _metrics_listen(ctx, _table(ctx, raw, "metrics"))
    return Config(
        path=path,
        store=store,
        daemon=daemon,
        defaults=defaults,
        agents=agents,
        circuit=circuit,
        alert_urls=urls,
        alert_urls_file=urls_file,
        prices=prices,
        metrics_listen=listen,
        pricing=pricing,
        budgets=label_budgets,
        drift=drift,
        otlp=_otlp(ctx, _table(ctx, raw, "otlp")),
    )


def _store(ctx: _Ctx, store_t: Mapping[str, Any]) -> StoreConfig:
    _check_keys(ctx, "store", store_t, ("url", "record_args", "record_errors", "keep_days"))
    url = store_t.get("url")
    if url is not None and (not isinstance(url, str) or not url):
        raise ctx.fail("store.url", "a SQLAlchemy URL string such as sqlite:///runs.db", url)
    record_errors = store_t.get("record_errors", "scrubbed")
    if record_errors not in RECORD_ERRORS_CHOICES:
        raise ctx.fail("store.record_errors", 'one of "scrubbed", "class"', record_errors)
    keep_days = StoreConfig.keep_days
    if "keep_days" in store_t:
        keep_days = _number(ctx, "store.keep_days", store_t["keep_days"], allow_zero=True)
    return StoreConfig(url=url, record_args=_bool(ctx, "store.record_args", store_t.get("record_args", False)),
                       record_errors=record_errors, keep_days=keep_days)


MAX_SHARDS = 1024  # watchdog.store.shards.BUCKETS: a shard is a range of the stored buckets


def _shards(ctx: _Ctx, value: object) -> int:
    """[daemon] shards: a whole number from 1 to MAX_SHARDS (absent: judging not sharded)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHARDS:
        raise ctx.fail("daemon.shards", f"a whole number of shards from 1 to {MAX_SHARDS} (or no key: "
                       "each daemon judges its own host's runs)", value)
    return value


def _users_and_shards(ctx: _Ctx, daemon_t: Mapping[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if "allowed_users" in daemon_t:
        users = daemon_t["allowed_users"]
        if not isinstance(users, list) or not all(isinstance(u, str) and u for u in users):
            raise ctx.fail("daemon.allowed_users", "a list of user names", users)
        d["allowed_users"] = tuple(users)
    if "shards" in daemon_t:
        d["shards"] = _shards(ctx, daemon_t["shards"])
    return d


def _daemon(ctx: _Ctx, daemon_t: Mapping[str, Any]) -> DaemonConfig:
    _check_keys(ctx, "daemon", daemon_t, ("tick_s", "cancel_grace_s", "term_grace_s", "allowed_users", "alert_retry_s",
                                          "alert_expire_s", "socket", "key_file", "state_dir", "shards"))
    d: dict[str, Any] = {}  # DaemonConfig's fields: seconds, user names, paths
    for k in ("tick_s", "cancel_grace_s", "term_grace_s", "alert_retry_s", "alert_expire_s"):
        if k in daemon_t:
            d[k] = _number(ctx, f"daemon.{k}", daemon_t[k], allow_zero=k.endswith("grace_s"))
    d.update(_users_and_shards(ctx, daemon_t))
    given = {}
    for k in ("state_dir", "socket", "key_file"):
        if k in daemon_t:
            value = daemon_t[k]
            if not isinstance(value, str) or (value and not os.path.isabs(value)):
                raise ctx.fail(f"daemon.{k}", 'an absolute path (or "" for the default)', value)
            given[k] = value
    resolved = resolve_paths(state_dir=given.get("state_dir", ""), socket=given.get("socket", ""),
                             key_file=given.get("key_file", ""))
    d.update(state_dir=resolved.state_dir, socket=resolved.socket, key_file=resolved.key_file)
    too_long = paths.socket_too_long(resolved.socket)
    if too_long:
        raise ctx.fail("daemon.socket", f"a shorter path ({too_long})", resolved.socket)
    daemon = DaemonConfig(**d)
    if daemon.alert_expire_s <= daemon.alert_retry_s:  # an alert must get at least one retry before it expires
        raise ctx.fail("daemon.alert_expire_s", f"a number of seconds > alert_retry_s ({daemon.alert_retry_s:g})",
                       daemon.alert_expire_s)
    return daemon


def _agents(ctx: _Ctx, agents_t: Mapping[str, Any], defaults: Budgets) -> dict[str, Budgets]:
    agents = {}
    for name, table in agents_t.items():
        if not isinstance(table, dict):
            raise ctx.fail(f"agents.{name}", "a table of budget keys", table)
        agents[name] = _budgets(ctx, f"agents.{name}", table, defaults)
    return agents


def _circuit(ctx: _Ctx, table: Mapping[str, Any]) -> CircuitConfig:
    circuit_t = dict(table)
    tools_t = circuit_t.pop("tools", {})
    if not isinstance(tools_t, dict):
        raise ctx.fail("circuit.tools", "a table of per-tool tables", tools_t)
    default_policy = _circuit_policy(ctx, "circuit", circuit_t, CircuitPolicy())
    tools = {}
    for tool, tool_t in tools_t.items():
        if not isinstance(tool_t, dict):
            raise ctx.fail(f"circuit.tools.{tool}", "a table with errors / window_s / open_s", tool_t)
        tools[tool] = _circuit_policy(ctx, f"circuit.tools.{tool}", tool_t, default_policy)
    return CircuitConfig(default=default_policy, tools=tools)


def _alerts(ctx: _Ctx, alerts_t: Mapping[str, Any],
            url_error: UrlCheck | None) -> tuple[tuple[str, ...], str | None]:
    """(`urls`, `urls_file`) of [alerts]; the file is read when alerts are sent (alert_urls)."""
    _check_keys(ctx, "alerts", alerts_t, ("urls", "urls_file"))
    urls = alerts_t.get("urls", [])
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise ctx.fail("alerts.urls", "a list of apprise URL strings", urls)
    urls_file = alerts_t.get("urls_file") or None  # "" = none, as an absent key (issue 36)
    if urls_file is not None and not isinstance(urls_file, str):
        raise ctx.fail("alerts.urls_file", "a file name (relative: in $CREDENTIALS_DIRECTORY) or an absolute path",
                       urls_file)
    for i, u in enumerate(urls):
        reason = url_error(u) if url_error else (None if "://" in u else "no scheme://")
        if reason:
            raise ctx.fail(f"alerts.urls[{i}]", f"an apprise URL ({reason})", url_scheme_only(u))
    return tuple(urls), urls_file


def _prices(ctx: _Ctx, prices_t: Mapping[str, Any]) -> dict[str, Price]:
    prices = {}
    for model, table in prices_t.items():
        section = f'prices."{model}"'
        if not isinstance(table, dict):
            raise ctx.fail(section, "a table with input_eur_per_mtok and output_eur_per_mtok", table)
        if len(model) > 128:
            raise ctx.fail(section, "a model name of at most 128 characters (the events.model column)", model[:20] + "…")
        _check_keys(ctx, section, table, PRICE_KEYS)
        for k in REQUIRED_PRICE_KEYS:
            if k not in table:
                raise ctx.fail(f"{section}.{k}", "a number >= 0 (EUR per million tokens)", "missing")
        amounts: dict[str, Any] = {k: _number(ctx, f"{section}.{k}", v, allow_zero=True) for k, v in table.items()}
        prices[model] = Price(**amounts)
    return prices


def _metrics_listen(ctx: _Ctx, metrics_t: Mapping[str, Any]) -> str:
    _check_keys(ctx, "metrics", metrics_t, ("listen",))
    listen = metrics_t.get("listen", "")
    if not isinstance(listen, str) or (listen and not _valid_listen(listen)):
        raise ctx.fail("metrics.listen", 'a "host:port" string such as "127.0.0.1:9464"', listen)
    return listen


def credential_by_hand(config: "Config") -> bool:
    """A relative urls_file (a systemd credential) read outside systemd: next to the config, where
    a daemon started by hand as its own user usually cannot read the root-only file."""
    f = config.alert_urls_file
    return bool(f) and not os.path.isabs(f or "") and not os.environ.get(ENV_CREDENTIALS)


def alert_urls(config: "Config", *, url_error: UrlCheck | None = None) -> tuple[str, ...]:
    """Every alert URL: `[alerts] urls`, then those of `[alerts] urls_file` (one per line, '#'
    comments), read here, when they are needed (the daemon, test-alert), not at every load.

    The file is what keeps secrets out of the config: under systemd it is a credential
    (LoadCredential=alert-urls:/etc/agent-watchdog/alert-urls) that only the service can read,
    named relative to $CREDENTIALS_DIRECTORY; without that variable (an operator's shell) a
    relative name is read next to the config file."""
    if not config.alert_urls_file:
        return config.alert_urls
    key, value = "alerts.urls_file", config.alert_urls_file
    if not os.path.isabs(value):
        base = os.environ.get(ENV_CREDENTIALS) or os.path.dirname(os.path.abspath(config.path or "."))
        value = os.path.join(base, value)
    where = config.path or "<config>"
    try:
        text = Path(value).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where}: {key}: cannot read {value} ({why})") from None
    urls = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for i, u in enumerate(urls):
        reason = url_error(u) if url_error else (None if "://" in u else "no scheme://")
        if reason:
            raise ConfigError(f"{where}: {key}: {value} line {i + 1}: expected an apprise URL ({reason}), "
                              f"got {url_scheme_only(u)!r}")
    return config.alert_urls + tuple(urls)

def _pricing(ctx: _Ctx, table: Mapping[str, Any]) -> PricingConfig:
    _check_keys(ctx, "pricing", table, ("eur_per_usd", "budget_tz"))
    rate = _number(ctx, "pricing.eur_per_usd", table.get("eur_per_usd", PricingConfig.eur_per_usd))
    tz = table.get("budget_tz", PricingConfig.budget_tz)
    if not isinstance(tz, str) or not tz:
        raise ctx.fail("pricing.budget_tz", 'an IANA time zone name such as "UTC" or "Europe/Paris"', tz)
    try:
        zone(tz)
    except ValueError:
        raise ctx.fail("pricing.budget_tz", 'an IANA time zone name such as "UTC" or "Europe/Paris"', tz) from None
    return PricingConfig(eur_per_usd=rate, budget_tz=tz)


def _label_budgets(ctx: _Ctx, raw: object) -> tuple[LabelBudget, ...]:
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ctx.fail("[[budgets]]", "an array of tables ([[budgets]] sections with labels = { ... })", raw)
    out: list[LabelBudget] = []
    seen: set[str] = set()
    for i, table in enumerate(raw):
        section = f"budgets[{i}]"
        _check_keys(ctx, section, table, ("labels", "max_cost_eur_per_day", "max_cost_eur_per_month", "warn_at"))
        labels = table.get("labels")
        if (not isinstance(labels, dict) or not labels
                or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items())):
            raise ctx.fail(f"{section}.labels", 'a table of label = "value" strings, such as { tenant = "acme" }',
                           labels)
        values: dict[str, Any] = {k: _number(ctx, f"{section}.{k}", table[k], allow_zero=True)  # the period budgets
                                  for k in ("max_cost_eur_per_day", "max_cost_eur_per_month") if k in table}
        if not values:
            raise ctx.fail(section, "max_cost_eur_per_day and/or max_cost_eur_per_month", "neither")
        warn_at = _number(ctx, f"{section}.warn_at", table.get("warn_at", WARN_AT))
        if warn_at > 1:
            raise ctx.fail(f"{section}.warn_at", "a number in (0, 1]", warn_at)
        budget = LabelBudget(dict(labels), warn_at=warn_at, **values)
        if len(budget.scope) > 255:
            raise ctx.fail(f"{section}.labels", "labels of at most 255 characters in all", "longer")
        if budget.scope in seen:
            raise ctx.fail(f"{section}.labels", "labels no other [[budgets]] entry has", labels)
        seen.add(budget.scope)
        out.append(budget)
    return tuple(out)


def _drift(ctx: _Ctx, table: Mapping[str, Any]) -> DriftConfig:
    _check_keys(ctx, "drift", table, ("window_s", "baseline_days", "factor", "min_runs"))
    d = DriftConfig()
    window_s = _number(ctx, "drift.window_s", table.get("window_s", d.window_s))
    if window_s < 300:  # the rollups are 5-minute buckets
        raise ctx.fail("drift.window_s", "a number of seconds >= 300", window_s)
    return DriftConfig(
        window_s=window_s,
        baseline_days=_number(ctx, "drift.baseline_days", table.get("baseline_days", d.baseline_days)),
        factor=_number(ctx, "drift.factor", table.get("factor", d.factor), allow_zero=True),
        min_runs=_number(ctx, "drift.min_runs", table.get("min_runs", d.min_runs), integer=True))


def _valid_listen(listen: str) -> bool:
    host, sep, port = listen.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def load(path: str | os.PathLike[str] | None = None, *, url_error: UrlCheck | None = None) -> Config:
    """Load the config from `path`, else $AGENT_WATCHDOG_CONFIG, else built-in defaults.

    `url_error` checks each alert URL for real (the daemon side passes apprise's loader:
    this module is shared with the SDK and must not import apprise); without it only the
    URL's shape is checked."""
    path = path or os.environ.get(ENV_CONFIG)
    if not path:
        return Config()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: expected a UTF-8 text file (undecodable byte at offset {exc.start})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from None
    return parse(raw, str(p), url_error=url_error)


def resolve_db_url(db: str | None, config: Config) -> str | None:
    """--db, else $AGENT_WATCHDOG_DB, else [store] url."""
    return db or os.environ.get(ENV_DB) or config.store.url

