#!/usr/bin/env bash
# A short run of every fuzz target, as part of `make test`. Longer runs:
#   FUZZTIME=20000000x scripts/fuzz-short.sh
# The budget is a number of executions, not a duration: Go 1.26's fuzzing
# coordinator can fail a target with a bare "context deadline exceeded"
# when a duration runs out under load (go.dev/issue/75804, fixed in 1.27).
# 150,000 executions take about 15 s for the slowest target here.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-150000x}
go test -run='^$' -fuzz='^FuzzRequests$' -fuzztime="$t" ./server
go test -run='^$' -fuzz='^FuzzCheckName$' -fuzztime="$t" ./node
go test -run='^$' -fuzz='^FuzzReadRequest$' -fuzztime="$t" ./datapath
go test -run='^$' -fuzz='^FuzzVerify$' -fuzztime="$t" ./cell
go test -run='^$' -fuzz='^FuzzDecodeACL$' -fuzztime="$t" ./access
go test -run='^$' -fuzz='^FuzzNames$' -fuzztime="$t" ./principal
