#!/bin/bash
# The image's HEALTHCHECK: GET /healthz on the admin API over loopback, with bash's /dev/tcp (no
# curl in the image). Exit 0 iff the answer is 200. The port is FENCEGATE_ADMIN_LISTEN's if that
# is set, else 9901 (the shipped config's). Also usable as a Kubernetes exec probe.
port=${FENCEGATE_ADMIN_LISTEN##*:}
port=${port:-9901}
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
read -r -t 2 status <&3 || exit 1
[[ $status == "HTTP/1.1 200"* ]]
