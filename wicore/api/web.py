"""The web page at `/`: a chat and a live view of the engine, served from files in the package.

    GET /                  static/index.html
    GET /web/{name}        static/{name}: the page's scripts and style (nothing else is served)
    GET /web/config.json   what the page needs to know: the model's name, whether it takes images,
                           whether it chats (a base model without a chat template only continues text)

Plain HTML, CSS and JavaScript: no build step, nothing fetched from another origin. Every file
goes out with a Content-Security-Policy that allows only this origin's scripts, styles and
connections (the chat streams over /v1/ws, wicore.api.websocket); the page has no inline script
or style, so it satisfies the policy it ships. `wicore serve --no-web` leaves these routes out.
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from wicore.api.errors import APIError

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


def read_static() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, media type) of every file the page is made of, read once."""
    folder = resources.files("wicore.api") / "static"
    files = {}
    for entry in folder.iterdir():
        media_type = MEDIA_TYPES.get(PurePosixPath(entry.name).suffix)
        if media_type is not None and entry.is_file():
            files[entry.name] = (entry.read_bytes(), media_type)
    if "index.html" not in files:
        raise FileNotFoundError("wicore/api/static/index.html is missing: reinstall wicore (its package data)")
    return files


class WebPage:
    def __init__(self) -> None:
        self.files = read_static()

    def _file(self, name: str) -> Response:
        found = self.files.get(name)
        if found is None:
            raise APIError(404, f"/web/{name} is not a file of the page", code="not_found")
        content, media_type = found
        return Response(content, media_type=media_type, headers=HEADERS)

    async def index(self, request: Request) -> Response:
        return self._file("index.html")

    async def asset(self, request: Request) -> Response:
        return self._file(request.path_params["name"])

    async def config(self, request: Request) -> Response:
        api = request.app.state.api
        api.guard(request)
        body = {
            "model": api.settings.model_name,
            "images": api.engine.vision is not None,
            "chat": api.can_chat,  # False: a base model, the page offers text continuation
            "max_context": api.engine.max_sequence_tokens,
        }
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    def routes(self) -> list[Route]:
        return [
            Route("/", self.index, methods=["GET"]),
            Route("/web/config.json", self.config, methods=["GET"]),
            Route("/web/{name}", self.asset, methods=["GET"]),
        ]
