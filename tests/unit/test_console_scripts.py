"""The console's scripts are classic scripts sharing one global scope (worker/api/console/*.js,
loaded in order by index.html): a top-level name defined in two of them is silently replaced by
the later one (a judge page's ``figure`` once blanked the dataset runs' agreement table)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

CONSOLE = Path(__file__).resolve().parents[2] / "worker" / "api" / "console"
TOP_LEVEL = re.compile(r"^(?:async\s+)?(?:function\s*\*?\s*|const\s+|let\s+|var\s+|class\s+)([A-Za-z_$][\w$]*)",
                       re.MULTILINE)


def test_no_top_level_name_is_defined_by_two_console_scripts() -> None:
    names = Counter(name for script in sorted(CONSOLE.glob("*.js")) for name in set(TOP_LEVEL.findall(script.read_text())))
    assert len(list(CONSOLE.glob("*.js"))) >= 9
    assert [name for name, count in names.items() if count > 1] == []


def test_every_console_script_is_loaded_by_the_page() -> None:
    page = (CONSOLE / "index.html").read_text()
    assert sorted(p.name for p in CONSOLE.glob("*.js")) == sorted(re.findall(r"/console/static/(\w+\.js)", page))
