#!/usr/bin/env bash
# The benchmark's peer (tests/bench/peer_quix.py) runs Quix Streams, whose releases pin an older
# pydantic than the project's; it gets a virtualenv of its own, .venv-bench, with the project
# installed from this tree and the `bench` extra (pins: tests/bench/peer-constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
[ -x .venv-bench/bin/python ] || "$python" -m venv .venv-bench
.venv-bench/bin/pip install -q --disable-pip-version-check -c tests/bench/peer-constraints.txt -e ./sdk -e '.[bench]'
