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
    """What the application serves from: the run roots, its token, the tails it follows and the answers the tabs
    share."""

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
    if host not in console.hosts:
        return PlainTextResponse(f"403: this console serves {console.hosts[0]}, not {host!r}\n", status_code=403)
    given = request.cookies.get(cookie_name(request), "") or request.query_params.get("token", "")
    if not hmac.compare_digest(given.encode(), console.token.encode()):
        return PlainTextResponse("403: no valid token: open the URL 'launcher ui' printed (its token is in "
                                 "$LAUNCHER_HOME/console/token)\n", status_code=403)
    if request.method != "GET" and request.headers.get("origin") != f"http://{host}":
        return PlainTextResponse("403: an action must come from this console's own page\n", status_code=403)
    return None


def application(console: Console) -> Starlette:
    """The Starlette application serving ``console``."""

    def api(read: Callable[[Request], Any]) -> Callable:
        """A JSON endpoint: ``read(request)`` in a worker thread; a refusal in the CLI's words is a 400."""
        async def endpoint(request: Request) -> Response:
            try:
                return JSONResponse(await run_in_threadpool(read, request))
            except (LaunchError, DamagedRun) as err:
                message = err.message if isinstance(err, LaunchError) else str(err)
                return JSONResponse({"error": message}, status_code=400)
        return endpoint

    def index(request: Request) -> Response:
        if "token" in request.query_params:  # the printed URL: keep the token in the cookie, not the address
            response = RedirectResponse("/" + (f"#{request.query_params['at']}" if "at" in request.query_params
                                               else ""), status_code=303)
            response.set_cookie(cookie_name(request), console.token, httponly=True, samesite="strict", path="/")
            return response
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    def action(request: Request) -> Dict[str, str]:
        kind, name = request.path_params["action"], request.path_params["name"]
        what = request.path_params["what"]
        if what not in ("run", "sweep"):
            raise LaunchError(f"no action on '{what}': allowed /api/run/NAME/ACTION and /api/sweep/ID/stop")
        try:
            return act("stop-sweep" if what == "sweep" and kind == "stop" else kind, console.root, name)
        finally:
            console.forget_pages()

    def curves(request: Request) -> Dict[str, Any]:
        rec = readers.lookup(console.roots, request.path_params["name"])
        points = min(MAX_POINTS, max(10, int(request.query_params.get("points", MAX_POINTS))))
        return readers.curves(console.tails.metrics(Path(rec.run_dir)), rec.gpus, points)

    def log(request: Request) -> Dict[str, Any]:
        offset = request.query_params.get("offset")
        return readers.log_tail(console.roots, request.path_params["name"], int(request.query_params.get("rank", 0)),
                                int(offset) if offset and offset.isdigit() else None)

    routes = [
        Route("/", index),
        Route("/api/runs", api(lambda r: console.shared_page(
            "runs?" + str(r.query_params), lambda: readers.runs_page(console.roots, dict(r.query_params))))),
        Route("/api/run/{name}", api(lambda r: readers.run_page(console.roots, r.path_params["name"]))),
        Route("/api/run/{name}/curves", api(curves)),
        Route("/api/run/{name}/log", api(log)),
        Route("/api/sweep/{sweep}", api(lambda r: readers.sweep_page(console.roots, r.path_params["sweep"]))),
        Route("/api/clusters", api(lambda r: console.shared_page("clusters", readers.clusters_page))),
        Route("/api/load", api(lambda r: {"slurm_calls": SHARED.calls, "slurm_every_s": SHARED.max_age_s})),
        Route("/api/{what:str}/{name}/{action:str}", api(action), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    async def guard(request: Request, call_next):
        return refused(console, request) or await call_next(request)
    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)])
