"""``/docs``: the API reference (Swagger UI over ``/openapi.json``), served from files shipped in
the packages - Swagger UI's own from ``swagger-ui-py``'s distribution - never from a CDN, under
the console's Content-Security-Policy. A script from another origin on this origin's pages could
read the console's API key from the tab's sessionStorage; and the reference works offline.
"""

from __future__ import annotations

import importlib.util
import pathlib
from importlib import resources

from fastapi import APIRouter, Path
from fastapi.responses import Response

from scoring.errors import NotFound
from worker.api.console_pages import HEADERS

router = APIRouter(include_in_schema=False)

# A fixed list (no path from the request reaches the file system): name -> (package, type)
FILES = {
    "swagger-ui-bundle.js": ("swagger_ui", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger_ui", "text/css; charset=utf-8"),
    "docs.js": ("worker.api", "text/javascript; charset=utf-8"),
}
# Swagger UI's files change only with the package: the browser may keep them (the page not).
STATIC_HEADERS = {**HEADERS, "Cache-Control": "public, max-age=86400"}


def _file(package: str, name: str) -> bytes:
    if package == "swagger_ui":  # its files only: importing it would load its web-framework glue
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations
        return (pathlib.Path(spec.submodule_search_locations[0]) / "static" / name).read_bytes()
    return resources.files(package).joinpath("docs", name).read_bytes()


@router.get("/docs")
async def docs_page() -> Response:
    return Response(_file("worker.api", "index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/docs/static/{name}")
async def docs_file(name: str = Path(max_length=40)) -> Response:
    if name not in FILES:
        raise NotFound(f"no docs file {name!r}")
    package, media_type = FILES[name]
    return Response(_file(package, name), media_type=media_type, headers=STATIC_HEADERS)
