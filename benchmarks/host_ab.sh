#!/usr/bin/env bash
# A change to the launch path's CPU time against a baseline tree, in alternating processes
# pinned to one core (the GPU machines' host times move 1.5-2x between runs otherwise):
#
#   git archive REV attncc templates grammars benchmarks examples | tar -x -C DIR
#   bash benchmarks/host_ab.sh DIR "SPEC SHAPE DTYPE TARGET;..." [ROUNDS]
#
# Per case and round, one process of each side (baseline first) prints the CPU time a
# repeated forward call costs (host_overhead.py with ISSUE_ONLY=1: the best of 5 batches of
# 200 unsynchronised calls) from its own tree, with caches of its own; with BACKWARD=1 each
# process runs backward_host.py on the case instead (a backward's CPU time through both
# backends, and a forward requiring grad's; target auto, TARGET ignored). SPEC names an
# example (examples/SPEC.attn). A pinned process that ran a CUDA backward ends in
# "terminate called without an active exception" at exit, after its output (torch 2.11
# alone does it: see gpu_suite.sh's bwdhost step).
set -uo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash benchmarks/host_ab.sh BASELINE_DIR \"SPEC SHAPE DTYPE TARGET;...\" [ROUNDS]" >&2
    exit 2
fi
baseline=$1 rounds=${3:-3}
cd "$(dirname "$0")/.."
IFS=';' read -ra cases <<< "$2"
for round in $(seq "$rounds"); do
    for case in "${cases[@]}"; do
        read -r spec shape dtype target <<< "$case"
        for root in "$baseline" .; do
            side=change
            [ "$root" != . ] && side="baseline $root"
            echo "== $side round $round: $case"
            (
                cd "$root" || exit 1
                export PYTHONPATH="$PWD:$PWD/benchmarks:${PYTHONPATH:-}"
                export ATTNCC_CACHE_DIR="/tmp/host_ab_cache_${side// /_}"
                export TRITON_CACHE_DIR="$ATTNCC_CACHE_DIR/triton" TARGET=$target DTYPE=$dtype
                if [ "${BACKWARD:-0}" = 1 ]; then
                    taskset -c 3 python3 benchmarks/backward_host.py "examples/$spec.attn" \
                        "$shape" --dtype "$dtype" --anchors none --no-profile
                else
                    ISSUE_ONLY=1 taskset -c 3 python3 benchmarks/host_overhead.py \
                        "examples/$spec.attn" "$shape"
                fi
            ) 2>&1 | grep -vE "Warning|warn|run_backward"
        done
    done
done
