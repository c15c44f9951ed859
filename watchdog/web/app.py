"""The WSGI application: routes, the read-only method rule, security headers, 404s.

It holds an engine opened read-only; each request reads in one snapshot (read_connection).
Runs are judged by the config file if one was given, else by the profiles the daemon
published (as the CLI does), so the page shows the budgets the daemon enforces.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from watchdog.core.config import Config
from watchdog.core.postmortem import file_stem
from watchdog.store.engine import Engine
from watchdog.web import api
from watchdog.web.api import BadRequest, NotFound
from watchdog.web.auth import CHALLENGE, Credentials

log = logging.getLogger("watchdog.web")

# No inline script, no eval, nothing from elsewhere; the page may only talk to itself.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
]
STATIC = {"refresh.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
HTML = "text/html; charset=utf-8"
JSON = "application/json"
SVG = "image/svg+xml"
MARKDOWN = "text/markdown; charset=utf-8"

Response = tuple[str, str, bytes, list[tuple[str, str]]]  # status, content type, body, extra headers

_ROUTES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"^/$"), "runs_page"),
    (re.compile(r"^/budgets$"), "budgets_page"),
    (re.compile(r"^/runs/([^/]+)$"), "run_page"),
    (re.compile(r"^/runs/([^/]+)/timeline\.svg$"), "timeline_svg"),
    (re.compile(r"^/runs/([^/]+)/postmortem$"), "postmortem_page"),
    (re.compile(r"^/runs/([^/]+)/postmortem\.md$"), "postmortem_md"),
    (re.compile(r"^/api/runs$"), "api_runs"),
    (re.compile(r"^/api/runs/([^/]+)$"), "api_run"),
    (re.compile(r"^/api/budgets$"), "api_budgets"),
]


class WebApp:
    def __init__(self, engine: Engine, config: Config, *, config_from_file: bool, allowed_hosts: Iterable[str] = (),
                 auth: Credentials | None = None, owner: str | None = None):
        self.views = api.Views(engine, config, config_from_file=config_from_file, owner=owner)
        self.auth = auth  # None: --no-auth (loopback only, the command checks)
        # Host names a request may name (DNS rebinding: a page elsewhere must not read the view
        # through a name that resolves to 127.0.0.1). Empty: any.
        self.allowed_hosts = {h.lower() for h in allowed_hosts}

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            status, ctype, body, extra = self.respond(method, environ)
        except Exception:  # noqa: BLE001 — a bad row or a store blip is one 500, never a dead server
            log.exception("web: %s %s failed", method, environ.get("PATH_INFO"))
            status, ctype, body, extra = _page("500 Internal Server Error", "the store could not be read; see the log")
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body))), *SECURITY_HEADERS, *extra]
        start_response(status, headers)
        return [b""] if method == "HEAD" else [body]

    def respond(self, method: str, environ: dict) -> Response:
        host = (environ.get("HTTP_HOST") or "").lower()
        if self.allowed_hosts and host not in self.allowed_hosts:
            return _page("421 Misdirected Request", "unknown Host: start the view with --allowed-host for this name")
        path = environ.get("PATH_INFO") or "/"
        if self.auth is not None and self.auth.check(environ.get("HTTP_AUTHORIZATION")) is None:
            # Nothing of the store before this: not even whether a run id exists.
            status, ctype, body, extra = (_json("401 Unauthorized", {"error": "authentication required"})
                                          if path.startswith("/api/") else
                                          _page("401 Unauthorized", "log in, or send Authorization: Bearer TOKEN"))
            return status, ctype, body, [*extra, *(("WWW-Authenticate", c) for c in CHALLENGE)]
        if method not in ("GET", "HEAD"):
            status, ctype, body, extra = _page("405 Method Not Allowed", "this view is read-only: GET and HEAD only")
            return status, ctype, body, [*extra, ("Allow", "GET, HEAD")]
        if path == "/favicon.ico":  # browsers ask; nothing to show
            return "204 No Content", "text/plain", b"", []
        if path.startswith("/static/"):
            return _static(path[len("/static/"):])
        query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True).items()}
        for pattern, name in _ROUTES:
            m = pattern.match(path)
            if m is None:
                continue
            # PEP 3333: PATH_INFO is already percent-decoded, as latin-1 text; ids are UTF-8.
            args = [g.encode("latin-1", "replace").decode("utf-8", "replace") for g in m.groups()]
            try:
                response = getattr(self, name)(query, *args)
                if response[1] == HTML:
                    return _with_banner(response, self.views.banner())
                return response
            except NotFound as exc:
                return _not_found(path, str(exc))
            except BadRequest as exc:
                if path.startswith("/api/"):
                    return _json("400 Bad Request", {"error": str(exc)})
                return _page("400 Bad Request", str(exc))
        return _not_found(path, "no such page")

    # -- pages ----------------------------------------------------------------------------------

    def runs_page(self, query: dict) -> Response:
        return _html(self.views.runs_html(_filters(query), query.get("before") or None))

    def run_page(self, query: dict, run_id: str) -> Response:
        return _html(self.views.run_html(_run_id(run_id)))

    def budgets_page(self, query: dict) -> Response:
        return _html(self.views.budgets_html())

    def postmortem_page(self, query: dict, run_id: str) -> Response:
        return _html(self.views.postmortem_html(_run_id(run_id)))

    def postmortem_md(self, query: dict, run_id: str) -> Response:
        rid, text = self.views.postmortem_md(_run_id(run_id))
        return "200 OK", MARKDOWN, text.encode(), [
            ("Content-Disposition", f'inline; filename="{file_stem(rid)}.md"')]

    def timeline_svg(self, query: dict, run_id: str) -> Response:
        return "200 OK", SVG, self.views.timeline_svg(_run_id(run_id)).encode(), []

    # -- JSON -----------------------------------------------------------------------------------

    def api_runs(self, query: dict) -> Response:
        limit = _int(query.get("limit"), 200, 1, 1000)
        records, next_before = self.views.runs_json(_filters(query), all_runs=query.get("all", "1") != "0",
                                                    limit=limit, before=query.get("before") or None)
        extra = []
        if next_before:
            extra.append(("Link", f'</api/runs?{api.next_query(query, next_before)}>; rel="next"'))
            extra.append(("X-Next-Before", next_before))
        status, ctype, body, _ = _json("200 OK", records)
        return status, ctype, body, extra

    def api_run(self, query: dict, run_id: str) -> Response:
        return _json("200 OK", self.views.run_json(_run_id(run_id), _int(query.get("events"), 15, 0, 10_000)))

    def api_budgets(self, query: dict) -> Response:
        return _json("200 OK", self.views.budgets_json())


def _run_id(text: str) -> str:
    """A run id or prefix as the CLI takes it (a plain-SQL writer chooses its own ids): only its length is
    checked here; the store's resolver answers "no such run" (404) for the rest."""
    if not 1 <= len(text) <= 128:
        raise NotFound("no such run")
    return text


def _filters(query: dict) -> dict[str, str]:
    from watchdog.web.pages import FILTERS

    out = {k: query[k].strip() for k in FILTERS if query.get(k, "").strip()}
    if "label" in out and "=" not in out["label"]:
        raise BadRequest("label: give key=value")
    return out


def _int(text: str | None, default: int, low: int, high: int) -> int:
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"not a number: {text[:32]!r}") from None
    return max(low, min(high, value))


def _html(text: str) -> Response:
    return "200 OK", HTML, text.encode(), []


def _with_banner(response: Response, banner: str | None) -> Response:
    """A page with the daemon's liveness banner at the top of its main part."""
    if banner is None:
        return response
    from watchdog.web.html import esc

    status, ctype, body, extra = response
    tag = f'<main><p class="banner" id="daemon-banner" role="alert">{esc(banner)}</p>'.encode()
    return status, ctype, body.replace(b"<main>", tag, 1), extra


def _json(status: str, data: Any) -> Response:
    return status, JSON, json.dumps(data, indent=2, default=str).encode(), []


def _page(status: str, message: str) -> Response:
    from watchdog.web.pages import error_page

    return status, HTML, error_page(status, message).encode(), []


def _not_found(path: str, message: str) -> Response:
    if path.startswith("/api/"):
        return _json("404 Not Found", {"error": message})
    return _page("404 Not Found", message)


def _static(name: str) -> Response:
    if name not in STATIC:
        return _page("404 Not Found", "no such file")
    body = resources.files("watchdog.web").joinpath("static", name).read_bytes()
    return "200 OK", STATIC[name], body, []
