#!/bin/bash
# The image's HEALTHCHECK: GET /healthz (or the path given, e.g. /readyz) on the admin API over
# loopback, with bash's /dev/tcp (no curl in the image). Exit 0 iff the answer is 200. The port
# is FENCEGATE_ADMIN_LISTEN's if that is set, else 9901 (the shipped config's). Also usable as a
# Kubernetes exec probe, so the kubelet need not reach the admin port over the network.
port=${FENCEGATE_ADMIN_LISTEN##*:}
port=${port:-9901}
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
path=${1:-/healthz}
[[ $path =~ ^/[A-Za-z0-9/_-]*$ ]] || exit 2
printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$path" >&3
read -r -t 2 status <&3 || exit 1
[[ $status == "HTTP/1.1 200"* ]]
