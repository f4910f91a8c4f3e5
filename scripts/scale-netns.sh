#!/bin/bash
# scale-netns.sh: the scale harness (hcomm/scale_netns_test.go, TestScaleNetns)
# at a shape of your choice: H network-namespace "hosts" on one bridge, P
# processes on each, one rank per process, started with torchrun's variables
# and joined through hcomm.InitFromEnv at hcomm's default settings. Every rank
# runs every collective, checked element by element, and the table printed
# at the end gives, per rank: init time, sockets, collective channels, RSS,
# shared memory and how much of its HCCL buffer is committed.
#
#   scripts/scale-netns.sh [H [P]]      default 4 2; 16 4 runs 64 ranks
#
# Environment: HCOMM_TRANSPORT (e.g. tcp, to keep shm out of a host) and
# every other hcomm variable pass through to the ranks; GOFLAGS to go test.
#
# Needs root (ip netns) and ip(8). Everything it creates (namespaces hcnt*,
# veths, a bridge, the rank processes) is removed when it ends, also when
# it fails or is interrupted; a namespace left by a run that was killed is
# removed by the next.
set -eu
H=${1:-4}
P=${2:-2}
case "$H$P" in *[!0-9]*) echo "usage: $0 [HOSTS [PROCS_PER_HOST]]" >&2; exit 2;; esac
if [ "$(id -u)" != 0 ]; then
  echo "$0: needs root to create network namespaces" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
HCOMM_SCALE="${H}x${P}" exec go test -count=1 -run '^TestScaleNetns$' -v -timeout 20m ./hcomm/
