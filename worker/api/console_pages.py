"""The console: ``/console``, a browser page for the people who own groups (their groups, each
group's incidents, ratings chart - with the level drift alerts judge against - recent results
with the members' verdicts, its backfills, the playground, creating and editing groups, dataset
runs, the judge templates checked against their labelled examples, the review of live results
- keyboard first, with a reviewer key alone). Static files shipped in the
package (``worker/api/console/``): no build chain, nothing to install but the package.

The page calls the same HTTP API as the SDK with the user's API key, which it keeps in the tab's
sessionStorage. Every response here forbids inline script, framing and third-party origins
(Content-Security-Policy), so a tenant string that got past the page's text-only rendering
still could not run.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Path
from fastapi.responses import RedirectResponse, Response

from scoring.errors import NotFound

router = APIRouter(include_in_schema=False)

FILES = {"console.js": "text/javascript; charset=utf-8", "filters.js": "text/javascript; charset=utf-8",
         "backfills.js": "text/javascript; charset=utf-8", "incidents.js": "text/javascript; charset=utf-8",
         "runs.js": "text/javascript; charset=utf-8",
         "calls.js": "text/javascript; charset=utf-8", "templates.js": "text/javascript; charset=utf-8",
         "reviews.js": "text/javascript; charset=utf-8", "judges.js": "text/javascript; charset=utf-8",
         "console.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _file(name: str) -> bytes:
    return resources.files("worker.api").joinpath("console", name).read_bytes()


@router.get("/console")
async def console_page() -> Response:
    return Response(_file("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/console/")
async def console_slash() -> RedirectResponse:
    return RedirectResponse("/console", status_code=308)


@router.get("/console/static/{name}")
async def console_file(name: str = Path(max_length=40)) -> Response:
    if name not in FILES:  # a fixed list: no path from the request reaches the file system
        raise NotFound(f"no console file {name!r}")
    return Response(_file(name), media_type=FILES[name], headers=HEADERS)
