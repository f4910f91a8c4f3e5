#!/bin/bash
# Issue 12's whole sitting, as BENCHMARKS.md records it since stop 38:
# ../shared/peers/sitting.sh's rows (16 B on every transport, the all-reduce
# at 64 KiB–64 MiB, every collective at 1 and 64 MiB in process and over
# shm), the 64 MiB all-to-all and all-gather between 4 ranks beside their
# floors (BenchmarkAlltoAllFloor, BenchmarkAllGatherFloor), hcomm's p2p
# round trip beside pingpong's, and every collective at 64 KiB and 1 MiB on
# every transport (scripts/sitting-colls.sh). About 20 minutes on the 2-core
# development VM; run it on a quiet machine, nothing else running.
#   scripts/issue12-sitting.sh            (PEERS: ../shared/peers by default)
set -u
proj=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$proj/../shared/peers}
bin=$(mktemp -d); trap 'rm -rf "$bin"' EXIT
cd "$proj" || exit 1
go build -o "$bin/hcomm" ./cmd/hcomm || exit 1
(cd collectives && go test -c -o "$bin/coll.test" .) || exit 1
gcc -O2 -o "$bin/pingpong" "$peers/pingpong.c" || exit 1
hc=$bin/hcomm
rank0() { awk -v b="$1" -v col="$2" '{ sub(/^\[[0-9]+\] */, "") } $1==b { print $col; exit }'; }
echo "# issue12-sitting $(date -u +%FT%TZ) $(git describe --always --dirty) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
"$peers/sitting.sh" "$proj" small ar-inproc ar-shm ar-tcp coll-inproc coll-shm
echo "## 64 MiB all-to-all and all-gather, 4 ranks, beside the floors (busbw GB/s, out of place)"
for i in 1 2 3; do
  f=$(cd collectives && "$bin/coll.test" -test.run XXX -test.bench 'AlltoAllFloor|AllGatherFloor' -test.benchtime 20x | awk '/busbw/{printf "%s %s  ", $1, $(NF-1)}')
  a=$("$hc" bench alltoall -g 4 -b 64M -e 64M -n 10 -w 3 -c 0 | rank0 67108864 8)
  s=$(HCOMM_TRANSPORT=shm "$hc" run -n 4 -- "$hc" bench alltoall -b 64M -e 64M -n 10 -w 3 -c 0 2>&1 | rank0 67108864 8)
  g=$(HCOMM_TRANSPORT=shm "$hc" run -n 4 -- "$hc" bench allgather -b 64M -e 64M -n 10 -w 3 -c 0 2>&1 | rank0 67108864 8)
  echo "$f | alltoall inproc $a shm $s | allgather shm $g"
done
echo "## p2p round trip beside pingpong (us)"
for i in 1 2 3; do
  ps=$("$bin/pingpong" shm 100000 3 2>&1 | tail -1)
  pt=$("$bin/pingpong" tcpspin 20000 3 2>&1 | tail -1)
  hs=$(HCOMM_TRANSPORT=shm "$hc" run -n 2 -- "$hc" bench p2p -b 8 -e 8 -n 20000 -w 2000 -c 0 2>&1 | rank0 8 6)
  ht=$(HCOMM_TRANSPORT=tcp "$hc" run -n 2 -- "$hc" bench p2p -b 8 -e 8 -n 4000 -w 1000 -c 0 2>&1 | rank0 8 6)
  echo "pingpong shm: $ps | hcomm p2p shm $hs | pingpong tcpspin: $pt | hcomm p2p tcp $ht"
done
MODES="shm inproc" REPS=5 scripts/sitting-colls.sh 65536 1048576
MODES=tcp REPS=5 scripts/sitting-colls.sh 65536 1048576
echo "# issue12-sitting done $(date -u +%FT%TZ)"
