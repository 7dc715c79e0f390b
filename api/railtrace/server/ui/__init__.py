"""The read-only web UI: one static page shell and its assets, served from the installed package.

The shell holds no data, so it is served without a token; every figure on a page comes from the
query API (`/api/v1/...`) through the browser with the same bearer token as any other API client.
Page URLs are deep links: `/` (fleet overview), `/requests` (with the list's filters as query
parameters), `/requests/{trace id or request id}`, `/topology`, `/contract`. Any other path outside
the machine interfaces answers 404 with the page shell, whose router says "Not found" in HTML.
"""

from __future__ import annotations

from html import escape
from importlib import resources
from typing import Final
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

STATIC: Final = resources.files(__package__) / "static"
MEDIA: Final = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}
# The entry module, the page modules under js/ and the stylesheet: every asset of the UI.
ASSETS: Final = (
    "app.js",
    "style.css",
    *sorted(f"js/{f.name}" for f in (STATIC / "js").iterdir() if f.name.endswith(".js")),
)
# Pages and assets come with the package: a browser may keep assets an hour; the shell is
# revalidated so a new version's shell never runs an old script.
SHELL_HEADERS: Final = {"cache-control": "no-cache", "x-content-type-options": "nosniff"}
ASSET_HEADERS: Final = {"cache-control": "public, max-age=3600", "x-content-type-options": "nosniff"}


# Paths of the machine interfaces (API, OTLP, Jaeger, probes, assets): their 404s stay JSON.
MACHINE_PREFIXES: Final = (
    "/api/",
    "/jaeger/",
    "/v1/",
    "/ui/static/",
    "/metrics",
    "/healthz",
    "/readyz",
    "/openapi",
)
SHELL: Final = (STATIC / "index.html").read_bytes()


async def not_found_page(request: Request, exc: Exception) -> Response:
    """A person's unknown path (a mistyped or old UI link) answers an HTML page, not JSON; the
    machine interfaces keep FastAPI's JSON errors."""
    assert isinstance(exc, StarletteHTTPException)
    path = request.url.path
    if exc.status_code == 404 and request.method in ("GET", "HEAD") and not path.startswith(MACHINE_PREFIXES):
        return Response(SHELL, status_code=404, media_type=MEDIA[".html"], headers=SHELL_HEADERS)
    return await http_exception_handler(request, exc)


def request_path(ident: str) -> str:
    """The UI page of one request (what exemplars, alerts and reports link to), the id
    percent-encoded: request ids may hold `/`, `?` or `#`."""
    return "/requests/" + quote(ident, safe="")


def create_router(grafana_url: str = "", grafana_datasource: str = "railtrace") -> APIRouter:
    """Routes for the pages and `/ui/static/<asset>`; read once, answered from memory. A
    configured Grafana (settings `grafana_url`, `grafana_datasource_uid`) rides in the shell as
    `<meta>` tags, for the request page's "Open in Grafana" link."""
    shell = SHELL
    if grafana_url:
        tags = (
            f'<meta name="railtrace-grafana-url" content="{escape(grafana_url.rstrip("/"))}">'
            f'<meta name="railtrace-grafana-datasource" content="{escape(grafana_datasource)}">'
        )
        shell = shell.replace(b"<head>", b"<head>" + tags.encode(), 1)
    assets = {name: (STATIC / name).read_bytes() for name in ASSETS}
    router = APIRouter(include_in_schema=False)

    def page() -> Response:
        return Response(shell, media_type=MEDIA[".html"], headers=SHELL_HEADERS)

    # `{ident:path}`: an id holding `/` arrives as `%2F`, which the server decodes before routing.
    for path in ("/", "/requests", "/requests/{ident:path}", "/topology", "/contract"):
        router.add_api_route(path, page, methods=["GET", "HEAD"], response_class=Response)

    @router.api_route("/ui/static/{name:path}", methods=["GET", "HEAD"])
    def asset(name: str) -> Response:
        body = assets.get(name)
        if body is None:
            raise HTTPException(404, f"no asset {name!r}")
        return Response(body, media_type=MEDIA["." + name.rsplit(".", 1)[-1]], headers=ASSET_HEADERS)

    return router
