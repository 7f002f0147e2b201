#!/usr/bin/env bash
# A short run of every fuzz target, as part of `make test`. Longer runs:
#   FUZZTIME=10m scripts/fuzz-short.sh
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-15s}
go test -run='^$' -fuzz='^FuzzRequests$' -fuzztime="$t" ./server
go test -run='^$' -fuzz='^FuzzCheckName$' -fuzztime="$t" ./node
go test -run='^$' -fuzz='^FuzzReadRequest$' -fuzztime="$t" ./datapath
