#!/bin/bash
# Every collective against Open MPI at the latency-bound and mid sizes, on every
# transport, 2 and 4 ranks: the rows ../shared/peers/sitting.sh does not have
# (its coll-* rows are 4 ranks, 1 and 64 MiB, inproc and shm only).
#   scripts/sitting-colls.sh [SIZES...]      default: 65536 1048576
# Env: COLLS (default "allreduce broadcast allgather reducescatter alltoall"),
#      MODES (inproc shm tcp), NPS (2 4), REPS (3). From 8 ranks on, hcomm runs
#      50 timed iterations as sitting.sh's scale rows do (at the default
#      HCCL_BUFFSIZE unless it is set);
#      64 processes: NPS=64 MODES=tcp COLLS=allreduce scripts/sitting-colls.sh 256 65536 1048576
#      (Open MPI's coll_bench starts at 4 bytes a rank: below that, its row is
#      4·np bytes, marked "(Open MPI at N B)" — 64 B at 16 ranks, 256 B at 64).
# Like sitting.sh it builds hcomm from this checkout and Open MPI's coll_bench.c
# from ../shared/peers, runs them interleaved launch by launch, and prints medians
# and the busbw ratio hcomm / Open MPI (above 1: hcomm ahead), with both times.
# It warns first when some process keeps a core busy (its figures would not compare).
set -u
proj=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$proj/../shared/peers}
sizes=${*:-65536 1048576}
REPS=${REPS:-3}
bin=$(mktemp -d); log=$(mktemp); trap 'rm -rf "$bin" "$log"' EXIT
(cd "$proj" && go build -o "$bin/hcomm" ./cmd/hcomm) || { echo "hcomm does not build"; exit 1; }
command -v mpicc >/dev/null || { echo "Open MPI is missing: run ../shared/peers/sitting.sh once (it installs it)"; exit 1; }
mpicc -O2 -o "$bin/coll_bench" "$peers/coll_bench.c" || exit 1
# A sitting on a machine something else keeps busy measures that something: a
# leftover spinner (a benchmark's orphaned child) halved tcp's ping-pong here
# once, unnoticed for ten minutes. Say so before the first row.
busy=$(top -bn2 -d 0.5 2>/dev/null | awk '/^top -/{f++} f==2 && $1 ~ /^[0-9]+$/ && $9+0 > 20 {printf " %s (pid %s, %s%%)", $12, $1, $9}')
[ -n "$busy" ] && echo "# WARNING: busy before the sitting:$busy — its figures are not comparable"
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
hrun() { # mode np coll bytes -> "time busbw"
  local mode=$1 np=$2 coll=$3 b=$4 n w
  if [ "$b" -le 65536 ]; then n=20000; w=20000; elif [ "$b" -le 4194304 ]; then n=200; w=50; else n=10; w=3; fi
  if [ "$mode" = tcp ] && [ "$b" -le 65536 ]; then n=4000; w=2000; fi
  if [ "$np" -ge 8 ]; then n=50; w=20; fi   # as sitting.sh's scale rows
  # The HCCL buffer at its default size (committed as it is touched, so 64
  # ranks start at the default settings), unlike sitting.sh's scale rows,
  # which set HCCL_BUFFSIZE=16 from 8 ranks on: at 64 ranks a 16 MB buffer
  # leaves the hellos too small for rd at 64 KiB (BENCHMARKS.md, stop 15).
  local buf=${HCCL_BUFFSIZE:-}
  if [ "$mode" = inproc ]; then
    env ${buf:+HCCL_BUFFSIZE=$buf} timeout 300 "$bin/hcomm" bench "$coll" -g "$np" -b "$b" -e "$b" -n $n -w $w -c 0 >"$log" 2>&1
  else
    env ${buf:+HCCL_BUFFSIZE=$buf} HCOMM_TRANSPORT=$mode timeout 300 "$bin/hcomm" run -n "$np" -- "$bin/hcomm" bench "$coll" -b "$b" -e "$b" -n $n -w $w -c 0 >"$log" 2>&1
  fi
  awk -v b="$b" '{ sub(/^\[[0-9]+\] */, "") } $1==b { if ($6=="N/A") print $10, $12; else print $6, $8; exit }' "$log"
}
mrun() { # transport np op bytes -> "time busbw"
  local tr=$1 np=$2 op=$3 b=$4 mca=()
  [ "$tr" = tcp ] && mca=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 127.0.0.1/8)
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$np" --mca oob_tcp_if_include 127.0.0.1/8 "${mca[@]}" \
    "$bin/coll_bench" -o "$op" -b "$b" -e "$b" -f 2 -r 3 -t 0.2 >"$log" 2>&1
  awk -v op="$op" -v b="$b" '$1==op && $2==b { print $4, $6; exit }' "$log"
}
mpiop() { case $1 in broadcast) echo bcast ;; reducescatter) echo reduce_scatter ;; *) echo "$1" ;; esac; }
echo "# sitting-colls $(date -u +%FT%TZ) $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); hcomm $(git -C "$proj" describe --always --dirty)"
for coll in ${COLLS:-allreduce broadcast allgather reducescatter alltoall}; do
  for mode in ${MODES:-inproc shm tcp}; do
    tr=sm; [ "$mode" = tcp ] && tr=tcp
    for np in ${NPS:-2 4}; do
      for b in $sizes; do
        ht=(); hb=(); mt=(); mb=()
        # coll_bench moves at least 4 bytes a rank: below 4·np bytes Open MPI
        # runs 4·np, and the row says so (hcomm keeps the size asked for).
        ms=$b note=
        if [ "$b" -lt $((4 * np)) ]; then ms=$((4 * np)) note="  (Open MPI at $ms B)"; fi
        for i in $(seq 1 "$REPS"); do
          read -r t bw < <(hrun "$mode" "$np" "$coll" "$b"); ht+=("${t:-nan}"); hb+=("${bw:-nan}")
          read -r t bw < <(mrun "$tr" "$np" "$(mpiop "$coll")" "$ms"); mt+=("${t:-nan}"); mb+=("${bw:-nan}")
        done
        h=$(med "${hb[@]}"); m=$(med "${mb[@]}"); htm=$(med "${ht[@]}"); mtm=$(med "${mt[@]}")
        # busbw is bytes over time, so the busbw ratio is Open MPI's time over
        # hcomm's: taken from the times, it stays exact where busbw rounds to 0.
        r=$(awk -v a="$htm" -v b="$mtm" 'BEGIN{ if (a>0 && b>0) printf "%.2f", b/a; else print "nan" }')
        printf '%-13s %-6s np=%s %9s  busbw hcomm %7s  OpenMPI %7s  ratio %5s  us hcomm %8s  OpenMPI %8s%s\n' \
          "$coll" "$mode" "$np" "$b" "$h" "$m" "$r" "$htm" "$mtm" "$note"
      done
    done
  done
done
