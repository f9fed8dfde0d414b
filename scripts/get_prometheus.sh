#!/usr/bin/env bash
# A Prometheus server for the dashboard's tests (tests/monitoring/test_grafana_dashboard.py), unless one is on PATH:
# Debian's package, unpacked into $VENV/prometheus (no service installed or started; no root needed where apt's package
# lists are present, root to fetch them where not). Says so and leaves it to the tests to fail where it cannot.
#   bash scripts/get_prometheus.sh [VENV] [--web]
# --web also unpacks the JavaScript packages its own graph pages load (scripts/prometheus_screenshot.py needs them).
set -euo pipefail
dest="${1:-.venv}/prometheus"
packages=prometheus
if [ "${2:-}" = "--web" ]; then
  packages="prometheus libjs-bootstrap4 libjs-d3 libjs-eonasdan-bootstrap-datetimepicker libjs-jquery libjs-jquery-hotkeys"
  packages="$packages libjs-moment libjs-moment-timezone libjs-mustache libjs-popper.js libjs-rickshaw"
  [ -e "$dest/usr/share/javascript/rickshaw" ] && exit 0
elif command -v prometheus >/dev/null || [ -x "$dest/usr/bin/prometheus" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "get_prometheus.sh: no apt-get here; put a prometheus binary on PATH for the dashboard's tests" >&2
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
download() { (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root $packages >/dev/null 2>&1); }
if ! download; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null && download
  else
    echo "get_prometheus.sh: apt-get cannot download prometheus without package lists; run 'sudo apt-get update'" >&2
    exit 0
  fi
fi
mkdir -p "$dest"
for deb in "$tmp"/*.deb; do
  dpkg-deb -x "$deb" "$dest"
done
echo "get_prometheus.sh: $("$dest/usr/bin/prometheus" --version 2>&1 | head -1) in $dest/usr/bin"
