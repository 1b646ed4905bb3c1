#!/usr/bin/env bash
# Installs everything the worker and its tests need on a fresh Debian machine, idempotently:
# Redis (Debian's redis-server), the code-scorer sandbox (bubblewrap, Debian's python3 with
# libseccomp's binding python3-seccomp), Prometheus with promtool (Debian's prometheus, for the
# dashboard and alert-rule tests), chromium and chromedriver (the console's browser tests), Java
# and Maven when missing, the Python virtualenv in .venv
# with the pinned versions of constraints.txt, helm (built from its Go module, for the chart's
# tests), and Kafka's jars from Maven Central.
#
#   devtools/bootstrap.sh        everything (./dev test)
#   devtools/bootstrap.sh run    what running the product needs (./dev demo, ./dev example): no image
#                              wheels, no helm - those are the test suite's
# Installers' output goes to .bootstrap.log and is shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
purpose=${1:-all}
case "$purpose" in all|run) ;; *) echo "bootstrap: unknown purpose '$purpose' (all or run)" >&2; exit 2 ;; esac
log=.bootstrap.log
: >"$log"

quietly() {  # a step's output added to $log; shown, with the step, only if it fails
  echo "== $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "bootstrap: failed: $* (its output: $log)" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

need_apt=()
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need_apt+=(redis-server)
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
# setpriv starts the sandboxes as SGW_SANDBOX_UID when the worker is root (essential in Debian).
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
/usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1 || need_apt+=(python3-seccomp)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
if [ "$purpose" = all ]; then  # the suite's: neither runs the product
  # Prometheus and promtool: tests/reliability/test_prometheus_live.py runs its own on loopback.
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
  # A headless browser for the console's tests (tests/e2e/test_console.py), driven through chromedriver.
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
fi
# A C compiler for the compiled hot path (deploy/compiled.py: mypyc writes C, gcc builds it).
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need_apt[*]} from Debian" >&2
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  quietly $sudo_cmd apt-get update -qq
  quietly $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml sdk/pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "bootstrap: installing Python packages into .venv (a minute or two, once)" >&2
  quietly .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
  # The SDK (sdk/) is a distribution of its own, which the server depends on: both in one go.
  quietly .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ./sdk -e '.[test]'
  rm -f .venv/.installed-*; touch "$stamp"
fi
# The image's dependencies as wheels, for tests/e2e/test_image.py to install the image's way
# offline (its own two distributions are built from the sources by the test itself); mypy for
# its compiled stage.
image_wheels=(./sdk . 'setuptools>=69' wheel mypy)
wheels_stamp=.wheels/.made-$(echo "${image_wheels[*]} $(basename "$stamp")" | sha256sum | cut -c1-16)
if [ "$purpose" = all ] && [ ! -f "$wheels_stamp" ]; then
  echo "bootstrap: collecting the image's wheels into .wheels (for the image's test)" >&2
  rm -rf .wheels
  quietly .venv/bin/pip wheel -q --disable-pip-version-check -c constraints.txt -w .wheels "${image_wheels[@]}"
  rm -f .wheels/scorer_group*.whl
  touch "$wheels_stamp"
fi

# Helm, for the chart's tests (tests/unit/test_helm_chart.py renders deploy/helm/): built once
# from its Go module, pinned, into .tools/.
# A binary built by go install reports only major.minor ("v4.3"): a stamp says which was built.
helm_version=v4.3.2
if [ "$purpose" = all ] && { [ ! -x .tools/helm ] || [ "$(cat .tools/helm.version 2>/dev/null)" != "$helm_version" ]; }; then
  go=$(command -v go || echo /usr/local/go/bin/go)
  [ -x "$go" ] || { echo "bootstrap: Go is needed to build helm $helm_version for the chart's tests (go install);" \
                         "./dev demo needs neither" >&2; exit 1; }
  echo "bootstrap: building helm $helm_version into .tools (for the chart's tests; once)" >&2
  quietly env GOBIN="$PWD/.tools" "$go" install "helm.sh/helm/v4/cmd/helm@$helm_version"
  echo "$helm_version" > .tools/helm.version
fi

.venv/bin/python -m devtools.services jars >/dev/null

# The per-trace path compiled with mypyc (deploy/compiled.py): built again only when a source it
# was made from changed; SGW_INTERPRETED=1 removes it and runs the sources.
.venv/bin/python -m deploy.compiled build
