#!/usr/bin/env bash
# image-context.sh DIR: the gateway image's docker build context in DIR
# (made if missing): the checkout's files (tracked and untracked, less the
# ignored), the terminal page's xterm files (make web), and the module
# vendor tree, so the build needs no network. The vendor tree stays in
# DIR: the checkout never gets one (which would change how every later
# go build resolves modules).
set -euo pipefail
dir=${1:?usage: image-context.sh DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! ls web/static/vendor/*.mjs >/dev/null 2>&1; then
  echo "image-context.sh: no xterm files in web/static/vendor: run make web first" >&2
  exit 1
fi
mkdir -p "$dir"
{ git ls-files -co --exclude-standard; ls -d web/static/vendor/*; } | sort -u |
  while read -r f; do [ -f "$f" ] && [ ! -L "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -C "$dir" -xf -
(cd "$dir" && go mod vendor)
