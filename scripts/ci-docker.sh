#!/usr/bin/env bash
# Makes a Docker daemon available for the docker provider's tests: installs
# Debian's docker.io (and busybox-static, from which the tests build their
# image) when missing, starts dockerd in the background when `docker info`
# fails, and waits up to 60 s for it to answer. Idempotent; safe to call
# when a daemon already runs.
set -euo pipefail

need=()
command -v dockerd >/dev/null || need+=(docker.io)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
  echo "ci-docker: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
  echo "ci-docker: daemon already running"
  exit 0
fi

echo "ci-docker: starting dockerd (log: /tmp/dockerd.log)"
# setsid + nohup: the daemon outlives this script and the shell that ran it.
setsid nohup dockerd >>/tmp/dockerd.log 2>&1 < /dev/null &

for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    echo "ci-docker: daemon up"
    exit 0
  fi
  # Poll twice a second for at most 60 s.
  sleep 0.5
done
echo "ci-docker: dockerd did not answer within 60 s; last log lines:" >&2
tail -n 30 /tmp/dockerd.log >&2 || true
exit 1
