#!/usr/bin/env bash
# A change to the backward timed against baseline trees, in alternating processes (ab.py's
# text variants reach the forward's generated module only):
#
#   git archive REV attncc templates grammars benchmarks examples | tar -x -C DIR
#   bash benchmarks/backward_ab.sh DIR[,DIR...] "SPEC [SPEC ...]" SHAPE [ROUNDS]
#
# Each DIR is made where git is (the device's copy of the tree has no history) and travels
# with the tree; several (comma-separated) are timed in turn, then the working tree. Per
# spec and round, one process of each side runs backward_backends.py (attncc's forward, its
# default backward and the Triton backward, --anchors none) from its own tree on SPEC's
# example, with caches of its own. The Triton backward is the control: the same code on
# every side unless the change is to it. With PROFILE=1 each process runs
# backward_profile.py instead: every kernel's GPU time a backward (torch.profiler), so a
# change to one of the backward's kernels shows apart from the others.
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash benchmarks/backward_ab.sh BASELINE_DIR[,DIR...] \"SPEC ...\" SHAPE [ROUNDS]" >&2
    exit 2
fi
baselines=$1 specs=$2 shape=$3 rounds=${4:-2}
cd "$(dirname "$0")/.."
IFS=',' read -ra trees <<< "$baselines"
trees+=(.)
for spec in $specs; do
    for round in $(seq "$rounds"); do
        for i in "${!trees[@]}"; do
            root=${trees[$i]} side=change cache=/tmp/backward_ab_cache_change
            [ "$root" != . ] && side="baseline $root" cache=/tmp/backward_ab_cache_$i
            echo "== $side $spec round $round"
            if [ "${PROFILE:-0}" = 1 ]; then
                # backward_profile.py imports attncc from the path: its own tree's first
                PYTHONPATH="$root:$root/benchmarks${PYTHONPATH:+:$PYTHONPATH}" \
                    ATTNCC_CACHE_DIR=$cache timeout 300 python3 \
                    "$root/benchmarks/backward_profile.py" "$root/examples/$spec.attn" "$shape" \
                    --no-flex 2>&1 | sed -n '/^attncc /,/backend:/p'
                continue
            fi
            ATTNCC_CACHE_DIR=$cache timeout 300 python3 \
                "$root/benchmarks/backward_backends.py" "$root/examples/$spec.attn" "$shape" \
                --rounds 2 --anchors none 2>&1 | grep -E "torch\.(bfloat16|float16):|Error"
        done
    done
done
