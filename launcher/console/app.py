"""The console's web application (Starlette): its pages, its JSON API, and the token every request must carry.

Access, as Jupyter's: ``launcher ui`` prints one URL with a random token (kept in a 0600 file, launcher/console/
serve.py). The first page taken with it answers with a redirect to the same page without it and an HttpOnly,
SameSite=Strict cookie holding it, so the token is in no later URL (history, Referer). Every request (page,
static file, API) without the token is 403: another user of the login node reaches the loopback port but cannot
read the file. A request for another host than the one served is 403 too (a DNS-rebinding page would name its
own), and an action is a POST whose Origin is this console's own: no GET changes anything. No secret value is
ever read here (the secrets store is the tasks' only, launcher/job/secret_store.py).

The pages are one static page and its script (launcher/console/static/: no build step, no CDN); what they show
comes from the API, read by launcher/console/readers.py and done by launcher/console/actions.py.
"""
from __future__ import annotations

import hmac
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from launcher.console import readers
from launcher.console.actions import act
from launcher.core.damage import DamagedRun
from launcher.errors import LaunchError
from launcher.slurm.client import SHARED

STATIC = Path(__file__).with_name("static")
PAGE_MAX_AGE_S = 2.0  # a runs page asked again within this is the same answer, whichever tab asks
MAX_POINTS = 2000  # the most points a curve is sent with


class Console:
    """What the application serves from: the run roots, its token, the Host names a request may give (none: any),
    the tails it follows and the answers the tabs share."""

    def __init__(self, roots: List[Path], root: Optional[Path], token: str, hosts: List[str]) -> None:
        self.roots, self.root, self.token, self.hosts = roots, root, token, hosts
        self.tails = readers.Tails()
        self._pages: Dict[str, tuple] = {}
        self._lock = threading.Lock()

    def shared_page(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, or the answer it gave to the same question less than PAGE_MAX_AGE_S ago."""
        with self._lock:
            kept = self._pages.get(key)
            if kept is None or time.monotonic() - kept[0] > PAGE_MAX_AGE_S:
                kept = (time.monotonic(), make())
                self._pages[key] = kept
        return kept[1]

    def forget_pages(self) -> None:
        with self._lock:
            self._pages.clear()


def cookie_name(request: Request) -> str:
    """One cookie per console: a browser keeps cookies per host, not per port."""
    return f"launcher_console_{request.url.port or 80}"


def refused(console: Console, request: Request) -> Optional[Response]:
    """Why ``request`` is not served (a 403 in one line), or None."""
    host = request.headers.get("host", "")
    if console.hosts and host not in console.hosts:
        return PlainTextResponse(f"403: this console serves {console.hosts[0]}, not {host!r}\n", status_code=403)
    given = request.cookies.get(cookie_name(request), "") or request.query_params.get("token", "")
    if not hmac.compare_digest(given.encode(), console.token.encode()):
        return PlainTextResponse("403: no valid token: open the URL 'launcher ui' printed (its token is in "
                                 "$LAUNCHER_HOME/console/token)\n", status_code=403)
    if request.method != "GET" and request.headers.get("origin") != f"http://{host}":
        return PlainTextResponse("403: an action must come from this console's own page\n", status_code=403)
    return None


def api(read: Callable[[Request], Any]) -> Callable:
    """A JSON endpoint: ``read(request)`` in a worker thread; a refusal in the CLI's words is a 400."""
    async def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(read, request))
        except (LaunchError, DamagedRun) as err:
            message = err.message if isinstance(err, LaunchError) else str(err)
            return JSONResponse({"error": message}, status_code=400)
    return endpoint


def number(request: Request, key: str, default: Optional[int]) -> Optional[int]:
    """The query's whole number ``key`` (``default`` when absent); a LaunchError naming it otherwise."""
    text = request.query_params.get(key, "")
    if not text:
        return default
    if not text.isdigit():
        raise LaunchError(f"{key} must be a whole number, got {text!r}")
    return int(text)


class Pages:
    """The endpoints, each reading through launcher/console/readers.py or acting through actions.py."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def index(self, request: Request) -> Response:
        if "token" in request.query_params:  # the printed URL: keep the token in the cookie, not the address
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(cookie_name(request), self.console.token, httponly=True, samesite="strict", path="/")
            return response
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    def runs(self, request: Request) -> Dict[str, Any]:
        console = self.console
        return console.shared_page("runs?" + str(request.query_params), lambda: readers.runs_page(
            console.roots, dict(request.query_params), console.tails))

    def run(self, request: Request) -> Dict[str, Any]:
        console, name, query = self.console, request.path_params["name"], request.query_params
        remote = readers.remote_named(query.get("cluster"))
        if remote is None:
            return readers.run_page(console.roots, name)
        rank, offset = number(request, "rank", 0), number(request, "log_offset", None)
        return console.shared_page(f"run?{query}", lambda: readers.remote_run_page(
            remote, name, console.tails, rank, offset, MAX_POINTS // 2, earlier=query.get("earlier") == "1"))

    def curves(self, request: Request) -> Dict[str, Any]:
        points = min(MAX_POINTS, max(10, number(request, "points", MAX_POINTS)))
        return readers.run_curves(self.console.roots, request.path_params["name"], self.console.tails, points,
                                  earlier=request.query_params.get("earlier") == "1")

    def log(self, request: Request) -> Dict[str, Any]:
        return readers.log_tail(self.console.roots, request.path_params["name"], number(request, "rank", 0),
                                number(request, "offset", None))

    def sweep(self, request: Request) -> Dict[str, Any]:
        return readers.sweep_page(self.console.roots, request.path_params["sweep"], self.console.tails)

    def clusters(self, request: Request) -> List[Dict[str, Any]]:
        return self.console.shared_page("clusters", lambda: readers.clusters_page(self.console.roots))

    def load(self, request: Request) -> Dict[str, Any]:
        return {"slurm_calls": SHARED.calls, "slurm_every_s": SHARED.max_age_s}

    def action(self, request: Request) -> Dict[str, str]:
        kind, name, what = request.path_params["action"], request.path_params["name"], request.path_params["what"]
        if what not in ("run", "sweep"):
            raise LaunchError(f"no action on '{what}': allowed /api/run/NAME/ACTION and /api/sweep/ID/stop")
        try:
            return act("stop-sweep" if what == "sweep" and kind == "stop" else kind, self.console.root, name,
                       readers.remote_named(request.query_params.get("cluster")), request.query_params.get("to"))
        finally:
            self.console.forget_pages()


def application(console: Console) -> Starlette:
    """The Starlette application serving ``console``, every request through :func:`refused` first."""
    pages = Pages(console)
    routes = [
        Route("/", pages.index),
        Route("/api/runs", api(pages.runs)),
        Route("/api/run/{name}", api(pages.run)),
        Route("/api/run/{name}/curves", api(pages.curves)),
        Route("/api/run/{name}/log", api(pages.log)),
        Route("/api/sweep/{sweep}", api(pages.sweep)),
        Route("/api/clusters", api(pages.clusters)),
        Route("/api/load", api(pages.load)),
        Route("/api/{what:str}/{name}/{action:str}", api(pages.action), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]

    async def guard(request: Request, call_next):
        return refused(console, request) or await call_next(request)
    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)])
