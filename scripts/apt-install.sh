#!/usr/bin/env bash
# Installs the named Debian packages with apt (as root, or with sudo available): the one place the
# project's scripts call apt (scripts/setup.sh, bench/run.sh).
set -euo pipefail
[ $# -gt 0 ] || exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing $*"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
