#!/usr/bin/env bash
# `make run`: start a single-node hoard server with its data in a local
# directory (on the first start it makes its cell there: a CA, its TLS
# certificate and an admin token), mount it with FUSE next to it as that
# admin, say how to use both, and stop everything on Ctrl-C.
set -euo pipefail
bin=$1 data=$2 listen=$3
top=$(dirname "$data")
mnt=${HOARD_MNT:-$top/mnt}
cache=${HOARD_CACHE:-$top/cache}
mkdir -p "$data" "$mnt" "$cache"
if "$bin" umount "$mnt" >/dev/null 2>&1; then echo "hoard: cleared a stale mount at $mnt"; fi
# Writes an earlier run could not store are kept; say so at every start.
if lost=$("$bin" cache lost --cache "$cache" 2>/dev/null) && [ "$lost" != "no lost writes" ]; then
  printf 'hoard: writes an earlier run could not store are kept in %s/lost:\n%s\n' "$cache" "$lost"
fi

# The server runs in a session of its own: Ctrl-C signals the whole
# foreground job, and a server stopped by it before cleanup's umount would
# leave the mount's write-back nowhere to go. The script stops it after.
setsid "$bin" server --data "$data" --listen "$listen" --log-level info &
server=$!
cell=$data/cell
# The cell's CA and admin token, for this script's client commands.
export HOARD_CA=$cell/ca.crt
sec=(--token "$cell/admin.token")
mounted=
cleanup() {
  if [ -n "$mounted" ]; then "$bin" umount "$mnt" || true; fi
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 0' INT TERM

for _ in $(seq 50); do
  [ -f "$cell/admin.token" ] && "$bin" ls / --server "$listen" --cache "" "${sec[@]}" >/dev/null 2>&1 && break
  sleep 0.1
done

if "$bin" mount --server "$listen" --cache "$cache" "${sec[@]}" --daemon "$mnt"; then
  mounted=1
  cat <<MSG

hoard is running, over TLS 1.3, for the users of cell tokens.
  server:  $listen, data in $data
  cell:    $cell (its CA ca.crt, and admin.token: a token for its admin)
  mounted: $mnt as that admin for whoever started it (cache in $cache);
           other local users act with their own tokens (hoard login)
Use it like any directory, from another shell:
  cp README.md $mnt/ && ls -l $mnt && cat $mnt/README.md
Or with the client commands, once you log in with the admin token:
  $bin login --ca $cell/ca.crt --file $cell/admin.token
  $bin ls -l / --server $listen
  $bin cache stats --cache $cache
Stop with Ctrl-C (unmounts and stops the server).
MSG
else
  cat <<MSG

hoard server is running on $listen (data in $data, cell in $cell), but the
FUSE mount failed (see the message above). The client commands work without
it, once you log in with the cell's admin token:
  $bin login --ca $cell/ca.crt --file $cell/admin.token
  $bin put README.md /README.md --server $listen
  $bin ls -l / --server $listen
Stop with Ctrl-C.
MSG
fi
wait "$server"
