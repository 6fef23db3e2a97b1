"""The dashboard's routes on the admin listener.

- ``GET /dashboard``: the page (``static/dashboard.html``), or, without the key, a 401
  with the sign-in form;
- ``POST /dashboard/login``: the form's key; right: a session cookie and back to the
  page (303); wrong: the form again, 401;
- ``GET /dashboard/data``: the history as JSON columns (``History.series``), 401
  without the key (header or session);
- ``GET /dashboard/latest``: the last snapshot alone (``prism top``), the same way;
- ``GET /dashboard/requests`` and ``/dashboard/requests/{id}``: the request log's window
  for the Requests page (``origin.dashboard.requests``), the same way;
- ``GET /dashboard/static/...``: the page's script and styles and uPlot (pinned in
  package.json, shipped in the package so the origin serves it offline). Public code,
  served without the key.

Without ``PRISM_ADMIN_KEY`` there is no dashboard: ``/dashboard`` answers 404 saying so,
and nothing is sampled.
"""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import parse_qs

from prism import AuthenticationError, NotFoundError

from ..http.asgi import Handler, Route, read_body
from ..http.request import Request
from ..http.responses import Reply, json_reply
from ..requestlog.window_reader import WindowReader
from .access import AdminAccess
from .history import History
from .requests import PREFIX, RequestsData

__all__ = ["Dashboard", "dashboard_off_routes"]

STATIC = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
_PAGE_HEADERS = {
    "content-type": "text/html; charset=utf-8",
    "cache-control": "no-store",
    # Only this origin's own files; no frames, no referrer to anywhere.
    "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
_MAX_FORM = 4096


class Dashboard:
    def __init__(self, history: History, admin_key: str, reader: WindowReader) -> None:
        self.history = history
        self.access = AdminAccess(admin_key)
        self.requests = RequestsData(reader)
        self._reader = reader
        self._page = (STATIC / "dashboard.html").read_bytes()
        self._login = (STATIC / "login.html").read_text()
        self._static = {
            path.name: path.read_bytes() for path in STATIC.iterdir() if path.suffix in _TYPES
        }

    async def close(self) -> None:
        """The sampling stops, and the Requests page's Redis connection closes."""
        await self.history.close()
        await self._reader.close()

    def routes(self) -> list[Route]:
        static = [
            Route(f"/dashboard/static/{name}", self._asset(name)) for name in sorted(self._static)
        ]
        return [
            Route("/dashboard", self.page),
            Route("/dashboard/login", self.login, frozenset({"POST"})),
            Route("/dashboard/data", self.data),
            Route("/dashboard/latest", self.latest),
            Route(PREFIX.rstrip("/"), self.request_list),
            Route(PREFIX, self.request_one),  # /dashboard/requests/{id}
            *static,
        ]

    def _login_form(self, message: str) -> Reply:
        body = self._login.replace("{message}", html.escape(message)).encode()
        return Reply(401, dict(_PAGE_HEADERS), body)

    async def page(self, request: Request) -> Reply:
        if not self.access.allows(request.headers):
            return self._login_form("")
        return Reply(200, dict(_PAGE_HEADERS), self._page)

    async def login(self, request: Request) -> Reply:
        body = await read_body(request.receive, _MAX_FORM, request.headers.get("content-length"))
        try:
            form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        except ValueError:  # more fields than the form has
            form = {}
        key = (form.get("key") or [""])[0]
        if not self.access.key_matches(key):
            return self._login_form("That is not the admin key.")
        return Reply(
            303,
            {
                "location": "/dashboard",
                "set-cookie": self.access.session_cookie(),
                "cache-control": "no-store",
            },
        )

    def _check(self, request: Request) -> None:
        if not self.access.allows(request.headers):
            raise AuthenticationError(
                "The dashboard needs the admin key: Authorization: Bearer <PRISM_ADMIN_KEY>,"
                " or sign in at /dashboard.",
                code="admin_key_required",
            )

    async def data(self, request: Request) -> Reply:
        self._check(request)
        headers = {"content-type": "application/json", "cache-control": "no-store"}
        return Reply(200, headers, self.history.series_json())

    async def latest(self, request: Request) -> Reply:
        self._check(request)
        return json_reply(self.history.latest(), {"cache-control": "no-store"})

    async def request_list(self, request: Request) -> Reply:
        self._check(request)
        return await self.requests.list(request)

    async def request_one(self, request: Request) -> Reply:
        self._check(request)
        return await self.requests.one(request)

    def _asset(self, name: str) -> Handler:
        reply_headers = {"content-type": _TYPES[Path(name).suffix], "cache-control": "max-age=300"}
        body = self._static[name]

        async def asset(request: Request) -> Reply:
            return Reply(200, dict(reply_headers), body)

        return asset


def dashboard_off_routes() -> list[Route]:
    """``/dashboard`` when there is no admin key: a 404 that says how to turn it on."""

    async def off(request: Request) -> Reply:
        raise NotFoundError(
            "The dashboard is off: set PRISM_ADMIN_KEY (at least 16 characters) and restart"
            " the origin.",
            code="dashboard_off",
        )

    paths = ("/dashboard", "/dashboard/data", "/dashboard/latest", PREFIX.rstrip("/"), PREFIX)
    return [Route(path, off) for path in paths]
