#!/usr/bin/env bash
# postmark-one-dir.sh N [DIR]: Debian's postmark with N files of 512 B-16 KiB
# and 4N transactions in one directory of a fresh hoard mount (a server and
# a mount started here, --cache-size 4G, CPU profiles in DIR), then the same
# on DIR's local file system; prints the wall-clock times and the server's
# and mount's CPU seconds. HOARD picks the binary (default bin/hoard).
# docs/benchmarks.md, "Postmark past the write-back window".
set -euo pipefail
n=$1
d=${2:-$(mktemp -d /tmp/hoard-postmark-XXXX)}
bin=$(readlink -f "${HOARD:-bin/hoard}")
command -v postmark >/dev/null || { echo "postmark not installed (Debian: apt-get install postmark)" >&2; exit 2; }
rm -rf "$d/srv" "$d/cache" "$d/mnt" "$d/local"
mkdir -p "$d/srv" "$d/cache" "$d/mnt" "$d/local"
port=$((20000 + RANDOM % 20000))
"$bin" server --data "$d/srv" --listen 127.0.0.1:$port --data-listen 127.0.0.1:0 --cpuprofile "$d/srv.prof" >"$d/srv.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; "$bin" umount "$d/mnt" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 50); do "$bin" ls / --server 127.0.0.1:$port --cache "" >/dev/null 2>&1 && break; sleep 0.1; done
"$bin" mount --server 127.0.0.1:$port --cache "$d/cache" --cache-size 4G --cpuprofile "$d/mnt.prof" "$d/mnt" >"$d/mnt.log" 2>&1 &
mnt=$!
for _ in $(seq 50); do mountpoint -q "$d/mnt" && break; sleep 0.1; done
mkdir "$d/mnt/pm"
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
run() {
  printf 'set location %s\nset number %d\nset transactions %d\nset size 512 16384\nset read 4096\nset write 4096\nset bias read 5\nset bias create 5\nset buffering false\nset seed 42\nrun\nquit\n' "$1" "$n" $((4 * n)) | postmark >"$2"
}
s0=$(ticks $srv); t0=$(date +%s.%N)
run "$d/mnt/pm" "$d/hoard.out"
t1=$(date +%s.%N); s1=$(ticks $srv); m1=$(ticks $mnt)
hz=$(getconf CLK_TCK)
echo "hoard N=$n: $(echo "$t1 - $t0" | bc) s, server CPU $(echo "scale=2; ($s1 - $s0) / $hz" | bc) s, mount CPU $(echo "scale=2; $m1 / $hz" | bc) s"
t0=$(date +%s.%N)
run "$d/local" "$d/local.out"
echo "local N=$n: $(echo "$(date +%s.%N) - $t0" | bc) s"
"$bin" umount "$d/mnt" >/dev/null
