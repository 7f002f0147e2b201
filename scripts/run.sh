#!/usr/bin/env bash
# `make run`: start a single-node hoard server with its data in a local
# directory, in the foreground, and say how to use it.
set -euo pipefail
bin=$1 data=$2 listen=$3
mkdir -p "$data"
cat <<MSG
hoard: starting a single-node server
  data:    $data
  address: $listen
Try, from another shell:
  $bin put README.md /README.md --server $listen
  $bin ls -l / --server $listen
  $bin cat /README.md --server $listen
  $bin cache stats
Stop with Ctrl-C.
MSG
exec "$bin" server --data "$data" --listen "$listen" --log-level info
