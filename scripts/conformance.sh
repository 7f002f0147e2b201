#!/usr/bin/env bash
# `make conformance`: run pjdfstest (the maintained Rust port of pjd's POSIX
# suite, from crates.io) on a real hoard FUSE mount and print pass/fail
# counts per test group. Exits non-zero if any test failed, or if FUSE is
# unusable while HOARD_REQUIRE_FUSE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/bin/hoard
pjd=${PJDFSTEST:-$(command -v pjdfstest || echo "$HOME/.cargo/bin/pjdfstest")}
if [ ! -x "$pjd" ]; then
  echo "conformance: installing pjdfstest 0.2.2 with cargo" >&2
  cargo install --quiet pjdfstest --version 0.2.2
  pjd=$HOME/.cargo/bin/pjdfstest
fi
if [ ! -r /dev/fuse ] || [ "$(id -u)" != 0 ]; then
  msg="conformance: SKIP: needs root and /dev/fuse (pjdfstest switches users)"
  if [ "${HOARD_REQUIRE_FUSE:-}" = 1 ]; then echo "${msg/SKIP/FAIL}" >&2; exit 1; fi
  echo "$msg" >&2; exit 0
fi
# pjdfstest's second dummy user.
getent passwd tests >/dev/null || echo "tests:x:::Dummy User for pjdfstest:/:/usr/sbin/nologin" | newusers

work=$(mktemp -d /tmp/hoard-conformance.XXXXXX)
chmod 755 "$work" # pjdfstest switches to unprivileged users
server=
cleanup() {
  "$bin" umount "$work/mnt" >/dev/null 2>&1 || true
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt"
"$bin" server --data "$work/data" --listen 127.0.0.1:0 2> "$work/server.log" &
server=$!
for _ in $(seq 50); do grep -qs serving "$work/server.log" && break; sleep 0.1; done
addr=$(sed -n 's/.* on \(127\.0\.0\.1:[0-9]*\) .*/\1/p' "$work/server.log" | head -1)
# As root with the cell's admin token: pjdfstest needs chown and setuid.
# --single-user: pjdfstest switches to other uids to test the mode bits;
# on a multi-user mount those uids, which never ran hoard login, would be
# anonymous and refused everything, where the suite expects the mode bits
# (which the kernel checks) to decide.
cell=$work/data/cell
cfg=$PWD/conformance/pjdfstest.toml
status=0
# suite NAME TRANSPORT [MOUNT FLAGS]: mount, run pjdfstest, print its
# counts, unmount.
suite() {
  local label=$1 transport=$2 out=$work/pjd-$1.out rc=0
  shift 2
  "$bin" mount --server "$addr" --cache "$work/cache-$label" --ca "$cell/ca.crt" --token "$cell/admin.token" --single-user --daemon "$@" "$work/mnt" 2> "$work/mount-$label.out"
  if ! grep -q "requests over $transport" "$work/mount-$label.out"; then
    echo "conformance: the mount does not serve over $transport:" >&2
    cat "$work/mount-$label.out" >&2
    exit 1
  fi
  mkdir -m 755 "$work/mnt/pjd-$label"
  (cd /tmp && "$pjd" -c "$cfg" -p "$work/mnt/pjd-$label") > "$out" 2>&1 || rc=$?
  echo "pjdfstest, requests over $transport:"
  awk '$NF ~ /^(ok|FAILED|skipped)$/ && $1 ~ /::/ { split($1, a, "::"); n[a[1] " " $NF]++; g[a[1]] = 1; t[$NF]++ }
       END { printf "%-16s %5s %7s %8s\n", "group", "ok", "failed", "skipped";
             for (x in g) printf "%-16s %5d %7d %8d\n", x, n[x " ok"], n[x " FAILED"], n[x " skipped"] | "sort";
             close("sort"); printf "%-16s %5d %7d %8d\n", "total", t["ok"], t["FAILED"], t["skipped"] }' "$out"
  "$bin" umount "$work/mnt"
  if [ "$rc" != 0 ]; then
    grep -E "FAILED$" "$out" >&2 || tail -20 "$out" >&2
    status=1
  fi
}
suite dev /dev/fuse --io-uring=false
# Again over io_uring where this kernel has it (Linux 6.14+); the fuse
# module's switch is turned on for the run and back after.
param=/sys/module/fuse/parameters/enable_uring
if [ -w "$param" ]; then
  was=$(cat "$param")
  echo Y > "$param"
  suite uring io_uring --io-uring
  echo "$was" > "$param"
else
  echo "conformance: SKIP over io_uring: this kernel has no FUSE over io_uring ($param)" >&2
fi
exit $status
