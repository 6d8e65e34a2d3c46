#!/usr/bin/env bash
# Builds docker/Dockerfile and runs the image: GET /healthz, the image's HEALTHCHECK, and one fenced
# write through the container (token 2 -> 200 from the upstream, stale token 1 -> 409, audited).
#
# No Docker engine needed: Debian's podman with the runc runtime, offline. The base image is
# made with debootstrap from Debian's archive and `podman import`ed as localhost/bookworm-base; its
# tarball is cached in $FENCEGATE_TEST_CACHE (default /var/cache/fencegate-test) and the imported
# image is reused while present, so only the first run on a machine pays for debootstrap. Delete
# the tarball and `podman rmi localhost/bookworm-base` to start cold.
# Builds and runs with --network=host and lowered ulimits (the host's nofile hard limit can be
# below podman's default). Runs as root. Exits non-zero, saying what failed, on any failure.
#   FENCEGATE_TEST_NO_CACHE=1   build without podman's layer cache (the base image is still reused)
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${FENCEGATE_TEST_CACHE:-/var/cache/fencegate-test}
base=localhost/bookworm-base
image=localhost/fencegate:test
mirror=http://deb.debian.org/debian
ulimits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

t0=$(date +%s)
phase_start=$t0
phase() { # name: report the time the previous phase took
  local now; now=$(date +%s)
  echo "test-image: [$((now - phase_start))s] $1"
  phase_start=$now
}
fail() { echo "test-image: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "run as root (podman import/debootstrap need it)"

need=()
for p in podman runc debootstrap python3 curl; do
  command -v "$p" >/dev/null || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "test-image: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    fail "could not install ${need[*]}"
fi
podman=(podman --runtime runc)

# 1. The base image: debootstrap once, cache the tarball, import once.
if ! "${podman[@]}" image exists "$base"; then
  if [ ! -s "$cache/bookworm-minbase.tar" ]; then
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    echo "test-image: debootstrap bookworm (minbase) from $mirror"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
      { rm -rf "$root"; fail "debootstrap failed, see $cache/debootstrap.log"; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$cache/bookworm-minbase.tar.tmp" . && mv "$cache/bookworm-minbase.tar.tmp" "$cache/bookworm-minbase.tar"
    rm -rf "$root"
    phase "made the base rootfs"
  fi
  "${podman[@]}" import "$cache/bookworm-minbase.tar" "$base" >/dev/null || fail "podman import failed"
  phase "imported $base"
else
  phase "reusing $base"
fi

# 2. The image, both stages from the local base.
build_flags=()
[ "${FENCEGATE_TEST_NO_CACHE:-0}" = 1 ] && build_flags+=(--no-cache)
"${podman[@]}" build --network=host "${ulimits[@]}" --format docker "${build_flags[@]}" \
  -f docker/Dockerfile --ignorefile docker/Dockerfile.dockerignore \
  --build-arg BASE_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" -t "$image" . ||
  fail "podman build failed"
phase "built $image ($("${podman[@]}" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"

# 3. Run it against a ledger upstream on loopback, on free ports.
work=$(mktemp -d /tmp/fencegate-image-test.XXXXXX)
ctr=fencegate-image-test-$$
up_pid=
cleanup() {
  "${podman[@]}" rm -f -t 2 "$ctr" >/dev/null 2>&1 || true
  [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); data_port=$(free_port); admin_port=$(free_port)
python3 examples/ledger_upstream.py "$up_port" & up_pid=$!

# The shipped config with its upstream pointed at the test's ledger; the listeners are moved to
# loopback and free ports by FENCEGATE_LISTEN / FENCEGATE_ADMIN_LISTEN (which the HEALTHCHECK also
# reads). The admin token file stays required, as in production.
python3 -c '
import json, sys
c = json.load(open("docker/fencegate.json"))
c["routes"][0]["upstream"] = "http://127.0.0.1:" + sys.argv[1]
json.dump(c, sys.stdout, indent=1)' "$up_port" >"$work/fencegate.json"
head -c 24 /dev/urandom | base64 >"$work/admin.token"
mkdir "$work/data"
chown 10001:10001 "$work/data" "$work/admin.token"  # the image's fencegate user
# The token is its owner's only (fencegate refuses a token file that group or others may read).
chmod 0400 "$work/admin.token"
chmod 0444 "$work/fencegate.json"

# --health-interval=disable: no systemd timer here; the test runs the HEALTHCHECK itself below.
# (podman 4.3 still complains that systemd is missing: its stderr is shown only on failure.)
"${podman[@]}" run -d --name "$ctr" --network=host "${ulimits[@]}" --health-interval=disable \
  -e FENCEGATE_LISTEN="127.0.0.1:$data_port" -e FENCEGATE_ADMIN_LISTEN="127.0.0.1:$admin_port" \
  -v "$work/fencegate.json:/etc/fencegate/fencegate.json:ro" \
  -v "$work/admin.token:/run/secrets/fencegate/admin.token:ro" \
  -v "$work/data:/var/lib/fencegate" \
  "$image" >/dev/null 2>"$work/podman-run.err" || { cat "$work/podman-run.err" >&2; fail "podman run failed"; }

admin=http://127.0.0.1:$admin_port data=http://127.0.0.1:$data_port
ok=
for _ in $(seq 100); do
  if curl -sf -o /dev/null "$admin/healthz"; then ok=1; break; fi
  [ "$("${podman[@]}" inspect -f '{{.State.Running}}' "$ctr" 2>/dev/null)" = true ] || break
  sleep 0.1
done
[ -n "$ok" ] || { "${podman[@]}" logs "$ctr" >&2 || true; fail "GET $admin/healthz never answered 200"; }
phase "container up, GET /healthz -> 200"

expect() { # what status curl-args...
  local what=$1 want=$2; shift 2
  local got; got=$(curl -s -o "$work/body" -w '%{http_code}' "$@") || true
  [ "$got" = "$want" ] || { cat "$work/body" >&2 2>/dev/null; "${podman[@]}" logs "$ctr" 2>&1 | tail -n 20 >&2; fail "$what: got $got, want $want"; }
  echo "test-image: $what -> $got"
}
"${podman[@]}" healthcheck run "$ctr" >/dev/null || fail "the image's HEALTHCHECK failed"
echo "test-image: the image's HEALTHCHECK (podman healthcheck run) -> healthy"
! "${podman[@]}" exec -e FENCEGATE_ADMIN_LISTEN=127.0.0.1:1 "$ctr" fencegate-healthcheck 2>/dev/null ||
  fail "the HEALTHCHECK passes against a port nothing listens on"
expect "GET /readyz" 200 "$admin/readyz"
expect "GET /v1/resources without the admin token" 401 "$admin/v1/resources"
uid=$("${podman[@]}" exec "$ctr" id -u)
[ "$uid" != 0 ] || fail "fencegate runs as root in the container"
echo "test-image: fencegate runs as uid $uid"

expect "POST /charges/alice, Fencing-Token: 2" 200 -X POST -H "Fencing-Token: 2" -H "Fencing-Leader: worker-b" \
  --data "charge alice" "$data/charges/alice"
expect "POST /charges/alice, stale Fencing-Token: 1" 409 -X POST -H "Fencing-Token: 1" -H "Fencing-Leader: worker-a" \
  --data "charge alice" "$data/charges/alice"
grep -q '"current_generation": *2' "$work/body" || fail "the 409 does not name current_generation 2: $(cat "$work/body")"
expect "POST without a token" 428 -X POST --data x "$data/charges/bob"
expect "GET /v1/resources/ledger with the admin token" 200 -H "Authorization: Bearer $(cat "$work/admin.token")" \
  "$admin/v1/resources/ledger"
grep -q '"generation": *2' "$work/body" || fail "resource ledger is not at generation 2: $(cat "$work/body")"
charges=$(curl -s "http://127.0.0.1:$up_port/ledger" | grep -o '"/charges/alice"' | wc -l)
[ "$charges" -eq 1 ] || fail "the ledger holds $charges charges for alice, want exactly 1"
echo "test-image: the upstream ledger holds exactly one charge (token 2)"
"${podman[@]}" exec "$ctr" fencegate audit --db /var/lib/fencegate/fence.db --json --decision rejected_stale |
  grep -q '"leader":"worker-a"' || fail "the stale write is missing from the audit log"
echo "test-image: the rejected write is in the audit log on the volume"
phase "fenced write checks passed"

"${podman[@]}" stop -t 15 "$ctr" >/dev/null 2>"$work/podman-stop.err" || { cat "$work/podman-stop.err" >&2; fail "podman stop failed"; }
code=$("${podman[@]}" inspect -f '{{.State.ExitCode}}' "$ctr")
[ "$code" = 0 ] || fail "fencegate exited $code on SIGTERM, want 0"
[ -s "$work/data/fence.db" ] || fail "no fence.db on the mounted volume"
phase "SIGTERM -> clean exit 0, fence.db on the volume"
echo "test-image: OK in $(( $(date +%s) - t0 ))s"
