#!/usr/bin/env bash
# Installs what fencegate needs to build and test, from Debian bookworm's archive. Idempotent:
# it asks apt only for what is missing. Runs as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libboost1.81-dev nlohmann-json3-dev libsqlite3-dev doctest-dev
  sqlite3 curl python3 etcd-server etcd-client
  clang-16 libclang-rt-16-dev llvm-16  # scripts/fuzz.sh: libFuzzer, llvm-symbolizer
  clang-format-16 clang-tidy-16        # scripts/lint.sh
  iproute2 iptables                    # tests/fault: network namespaces and partitions
  libssl-dev openssl nginx haproxy     # TLS (listener, upstream, etcd) and the tests' https upstream
  zookeeper libzookeeper-mt-dev        # the ZooKeeper token source and its tests' server
  redis-server libhiredis-dev          # the Redis token source and its tests' server
  prometheus                           # promtool and a real Prometheus for the alert tests
  chromium chromium-driver python3-selenium  # the status page, tested in a real browser
  python3-yaml                         # the monitoring test reads the alert rules
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all build and test packages are installed"
  exit 0
fi

echo -n "setup: "
"$(dirname "$0")/apt-install.sh" "${missing[@]}"
echo "setup: done"
