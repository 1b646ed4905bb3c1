"""The docs: a site that builds strictly (a broken link, a missing anchor or a page no nav
reaches fails it), a README that stays a quickstart, and nothing that points outside the
repository for what the project means."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    settings = (tmp_path / "site" / "operate" / "settings" / "index.html").read_text()
    assert "SGW_JUDGE_CONCURRENCY_PER_PROJECT" in settings, "the settings table is made from the code"
    traces = (tmp_path / "site" / "connect" / "traces" / "index.html").read_text()
    assert "traceId" in traces and "<!-- trace-schema -->" not in traces
    reference = (tmp_path / "site" / "api" / "reference" / "index.html").read_text()
    assert 'id="post-v1scorer-groupsidgrade"' in reference, "the HTTP reference is rendered from openapi.json"
    sdk = (tmp_path / "site" / "api" / "sdk" / "index.html").read_text()
    assert 'id="scorer_groups._sync.ScorerGroups.ratings"' in sdk, "the SDK reference comes from its code"


def test_the_readme_is_a_quickstart_that_links_into_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target


def test_nothing_points_outside_the_repository_for_its_meaning() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        assert "../shared" not in text and "shared/spec" not in text and "design.md" not in text, page
