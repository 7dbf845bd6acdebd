#!/usr/bin/env bash
# Everything attncc does on a GPU, in one device call: GPU tests, `attncc check` of every
# example, the benchmark matrix against SDPA (FA2, cuDNN) and FlexAttention, start-up times.
# Files go under $OUT (the device tool brings them back), named by what they measure and the
# GPU (`matrix_h100.jsonl`, `startup_h100.txt`); a short summary is printed last. Every step
# is described in benchmarks/README.md.
#
#   bash benchmarks/gpu_suite.sh [tests] [check] [kernels] [bench] [backward] [quick] [auto] [startup] [firstcall] [coldrounds] [calls] [compiled] [decode] [sweep] [cuda] [cudacol] [profile] [ab] [times] [side] [hf] [hfcompile] [growing] [varlen] [wide] [fp8] [heuristic] [parts] [onepass] [gradients] [fuzz] [bwdcuda] [bwdhost]
#   (default: tests check bench startup)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/attncc_gpu_out}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import lark" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # keep a lark the caller put on the path
fi
export PYTHONUNBUFFERED=1
export ATTNCC_CACHE_DIR=${ATTNCC_CACHE_DIR:-/tmp/attncc_cache}
steps=${*:-tests check bench startup}
has() { [[ " $steps " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
# the GPU's short name in file names: results of two GPUs are never mixed in one table
gpu=$(head -1 "$OUT/device.txt" | grep -oiE 'h100|h200|a100|b200|l40s?' | head -1 | tr '[:upper:]' '[:lower:]')
gpu=${gpu:-gpu}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"


if has startup; then
    # cold: empty attncc and Triton caches (the heuristic table, then inline tuning);
    # warm: a new process reusing both caches, which must not tune again.
    # With Python's bytecode cache on, as on a normal install: the GPU machine sets
    # PYTHONDONTWRITEBYTECODE, and every process then recompiled the modules Triton and
    # torch import lazily from source (0.15-0.2 s of a warm start on an H200)
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=/tmp/startup_pycache
    export ATTNCC_CACHE_DIR=/tmp/startup_cache/attncc TRITON_CACHE_DIR=/tmp/startup_cache/triton
    rm -rf /tmp/startup_cache
    ATTNCC_AUTOTUNE=0 python3 benchmarks/startup.py examples/gqa_causal.attn cold-no-autotune | tee -a "$OUT/startup_$gpu.txt"
    rm -rf /tmp/startup_cache
    ATTNCC_AUTOTUNE=1 python3 benchmarks/startup.py examples/gqa_causal.attn cold-autotune | tee -a "$OUT/startup_$gpu.txt"
    # warm twice: the spread between two processes on the same caches
    for _ in 1 2; do
        python3 benchmarks/startup.py examples/gqa_causal.attn warm | tee -a "$OUT/startup_$gpu.txt"
    done
    # Triton's own import apart: timed before the clock starts, as where torch.compile ran
    python3 benchmarks/startup.py examples/gqa_causal.attn warm-triton-imported triton-imported | tee -a "$OUT/startup_$gpu.txt"
    # the default target (auto: CUDA on an H100/H200), its caches apart
    export ATTNCC_CACHE_DIR=/tmp/startup_cache/auto
    TARGET=auto python3 benchmarks/startup.py examples/gqa_causal.attn cold | tee -a "$OUT/startup_$gpu.txt"
    TARGET=auto python3 benchmarks/startup.py examples/gqa_causal.attn warm | tee -a "$OUT/startup_$gpu.txt"
    TARGET=auto python3 benchmarks/startup.py examples/gqa_causal.attn warm | tee -a "$OUT/startup_$gpu.txt"
fi

if has firstcall; then
    # The issue's first-call and host-overhead targets, per case "SPEC SHAPE DTYPE TARGET
    # [backward]": cold (empty attncc and Triton caches; no tuning: the heuristic table),
    # warm (a new process on those caches), then the CPU time of a repeated call (200
    # unsynchronised calls). Targets: cold <= 3 s, warm <= 0.2 s, <= 15 us a call.
    # "backward": the inputs require grad and the first backward is timed too.
    unset PYTHONDONTWRITEBYTECODE ATTNCC_AUTOTUNE
    export PYTHONPYCACHEPREFIX=/tmp/startup_pycache
    IFS=';' read -ra fc_cases <<< "${FIRSTCALL_CASES:-causal 2,8,1024,128 fp16 triton;causal 2,8,64,64 fp32 triton;alibi 2,8,256,64 fp16 triton;decode 8,32:8,8192,128 bf16 triton;decode 1,32:8,8192,128 bf16 triton;paged_decode 1,32:8,8192,128 bf16 triton;causal 1,16,64,128 fp16 cuda}"
    for fc_case in "${fc_cases[@]}"; do
        read -r fc_spec fc_shape fc_dtype fc_target fc_backward <<< "$fc_case"
        export ATTNCC_CACHE_DIR=/tmp/firstcall_cache/attncc TRITON_CACHE_DIR=/tmp/firstcall_cache/triton
        rm -rf /tmp/firstcall_cache
        for fc_run in cold warm; do
            TARGET=$fc_target timeout 300 python3 benchmarks/startup.py "examples/$fc_spec.attn" \
                "$fc_run" "shape=$fc_shape" "dtype=$fc_dtype" $fc_backward 2>&1 | grep -vE "Warning|warn"
        done
        TARGET=$fc_target DTYPE=$fc_dtype ISSUE_ONLY=1 timeout 300 python3 benchmarks/host_overhead.py \
            "examples/$fc_spec.attn" "$fc_shape" 2>&1 | grep -vE "Warning|warn"
    done | tee "$OUT/firstcall_$gpu.txt"
fi

if has coldrounds; then
    # The spread of cold first calls: ROUNDS fresh processes a case of COLD_CASES ("SPEC SHAPE
    # DTYPE TARGET;..."), each on empty caches, cases alternating, with each phase's span
    # (startup.py phases): what a first call waits for, and what varies between runs. A case
    # may end in startup.py's flags ("backward"), "tune" (ATTNCC_AUTOTUNE=1: tuning inline).
    # COLD_BASE=DIR: each case runs on that tree too (a copy of attncc, templates, grammars,
    # benchmarks and examples), before this one, in the same round: an A/B of first calls
    unset PYTHONDONTWRITEBYTECODE ATTNCC_AUTOTUNE
    IFS=';' read -ra cold_cases <<< "${COLD_CASES:-causal 2,8,64,64 fp32 auto;causal 2,8,512,128 bf16 auto;causal 1,16,2048,128 bf16 auto}"
    for round in $(seq "${ROUNDS:-5}"); do
        for cold_case in "${cold_cases[@]}"; do
            read -r c_spec c_shape c_dtype c_target c_flags <<< "$cold_case"
            c_env=()
            [[ " $c_flags " == *" tune "* ]] && c_env=(ATTNCC_AUTOTUNE=1)
            c_flags=${c_flags//tune/}
            for c_tree in ${COLD_BASE:+"$COLD_BASE"} "$PWD"; do
                rm -rf /tmp/cold_cache
                (cd "$c_tree" && echo "tree: $c_tree" &&
                    env "${c_env[@]}" PYTHONPATH="$c_tree:$PYTHONPATH" \
                    PYTHONPYCACHEPREFIX="/tmp/startup_pycache$c_tree" ATTNCC_CACHE_DIR=/tmp/cold_cache/attncc \
                    TRITON_CACHE_DIR=/tmp/cold_cache/triton TARGET=$c_target timeout 300 \
                    python3 benchmarks/startup.py "examples/$c_spec.attn" "cold-$round" phases \
                    "shape=$c_shape" "dtype=$c_dtype" $c_flags 2>&1 | grep -vE "Warning|warn")
            done
        done
    done | tee "$OUT/firstcall_rounds_$gpu.txt"
fi

if has calls; then
    # What a repeated call costs at small prefill shapes and in decode (benchmarks/calls.py):
    # eager and CUDA-graph time a call over a rotation of cold input copies, CPU time to issue
    # one, beside SDPA's default backend (prefill) or FA2 (decode). CALLS_CASES narrows it.
    unset ATTNCC_AUTOTUNE
    timeout 560 python3 benchmarks/calls.py --json "$OUT/calls_$gpu.jsonl" \
        ${CALLS_CASES:+--cases "$CALLS_CASES"} 2>&1 | grep -vE "Warning|warn" | tee "$OUT/calls_$gpu.log" | tail -60
fi

if has compiled; then
    # What a torch.compile'd caller adds to a call's CPU time, attncc's and SDPA's
    # (benchmarks/compiled_calls.py); COMPILED_CASES narrows it, COMPILED_BASE=DIR runs a
    # baseline tree's attncc first (git archive REV attncc templates grammars | tar -x -C DIR)
    unset ATTNCC_AUTOTUNE
    for root in ${COMPILED_BASE:-} .; do
        echo "== compiled calls: $root"
        (cd "$root" && PYTHONPATH="$PWD:$PYTHONPATH" ATTNCC_CACHE_DIR="/tmp/compiled_cache_${root//[.\/]/_}" \
            timeout 400 python3 "$OLDPWD/benchmarks/compiled_calls.py" --grad \
            --json "$OUT/compiled_calls_$gpu.jsonl" ${COMPILED_CASES:+--cases "$COMPILED_CASES"}) \
            2>&1 | grep -vE "Warning|warn|originates|^ +|^$" | tee -a "$OUT/compiled_calls_$gpu.log" | tail -12
    done
fi

BENCH_JSON="$OUT/bench_$gpu.jsonl"
bench() {  # bench SPEC SHAPES DTYPE: rows go to $BENCH_JSON; shapes already there are skipped
    python3 -m attncc bench "$1" --shapes "$2" --dtype "$3" --target "${BENCH_TARGET:-triton}" \
        --json "$BENCH_JSON" --resume 2>&1 \
        | grep -vE "Warning|return sdpa" | tee -a "$OUT/bench.log"
}
if has quick; then
    for spec in fused causal sliding_window alibi softcap document_mask gqa_causal; do
        shapes="4,16,4096,128"
        [ "$spec" = gqa_causal ] && shapes="2,32:8,4096,128"
        bench "examples/$spec.attn" "$shapes" bf16
    done
    bench examples/decode.attn "1,32:8,8192,128;8,32:8,8192,128;8,32:8,32768,128" bf16
fi

if has auto; then
    # the default target (auto: CUDA for fused prefill on an H100/H200, document masks
    # included, Triton for decode) on issue 4's variants, 2k/4k/16k at head dim 128 and 4k at 64
    shapes="8,16,2048,128;4,16,4096,128;1,16,16384,128;4,32,4096,64"
    for spec in fused causal sliding_window alibi softcap document_mask; do
        BENCH_TARGET=auto bench "examples/$spec.attn" "$shapes" bf16
    done
    BENCH_TARGET=auto bench examples/gqa_causal.attn "8,32:8,2048,128;4,32:8,4096,128" bf16
fi

if has ab; then
    # ab.py (text variants of the generated module against it, interleaved) on each
    # "SPEC SHAPE" of AB_CASES (;-separated), the variants in the JSON file AB_VARIANTS,
    # for AB_TARGET (cuda unless set)
    IFS=';' read -ra ab_cases <<< "${AB_CASES:?AB_CASES: \"causal 8,16,2048,128;...\"}"
    for ab_case in "${ab_cases[@]}"; do
        read -r ab_spec ab_shape <<< "$ab_case"
        timeout 240 python3 benchmarks/ab.py "examples/$ab_spec.attn" "$ab_shape" \
            "${AB_VARIANTS:?AB_VARIANTS: a JSON file of variants}" --target "${AB_TARGET:-cuda}" 2>&1 \
            | grep -vE "Warning|warn" | tee -a "$OUT/ab_$gpu.txt"
    done
fi

if has times; then
    # kernel_times.py (each kernel's time a call beside the call's) on each "SPEC SHAPE
    # [TARGET [NAME=VALUE ...]]" of TIMES_CASES (;-separated)
    IFS=';' read -ra times_cases <<< "${TIMES_CASES:?TIMES_CASES: \"document_mask 4,16,4096,128 cuda;...\"}"
    for times_case in "${times_cases[@]}"; do
        read -ra times_args <<< "$times_case"
        times_args[0]="examples/${times_args[0]}.attn"
        timeout 180 python3 benchmarks/kernel_times.py "${times_args[@]}" 2>&1 \
            | grep -vE "Warning|warn" | tee -a "$OUT/kernel_times_$gpu.txt"
    done
fi

if has side; then
    # side_by_side.py (kernels of several specs and targets on one shape, one process) on
    # each "SHAPE SPEC@TARGET ..." of SIDE_CASES (;-separated)
    side_default="4,32,4096,64 causal@cuda softcap@cuda softcap@triton;4,16,4096,128 causal@cuda softcap@cuda softcap@triton"
    IFS=';' read -ra side_cases <<< "${SIDE_CASES:-$side_default}"
    for side_case in "${side_cases[@]}"; do
        read -ra side_args <<< "$side_case"
        timeout 180 python3 benchmarks/side_by_side.py "${side_args[@]}" 2>&1 \
            | grep -vE "Warning|warn" | tee -a "$OUT/side_by_side_$gpu.txt"
    done
fi

if has decode; then
    ATTNCC_AUTOTUNE=0 python3 -m pytest -q -m gpu tests/gpu -k "decode or split_kv" 2>&1 | tee "$OUT/gpu_tests_decode.log" | tail -3
    for spec in decode paged_decode decode_window speculative_decode; do
        ATTNCC_AUTOTUNE=0 python3 -m attncc check "examples/$spec.attn" --device cuda --target triton --trials 6 --max-len 4096 || echo "CHECK FAILED: $spec"
    done 2>&1 | tee "$OUT/check_decode.log" | grep -E "passed|FAILED"
    decode_shapes="1,32:8,8192,128;8,32:8,8192,128;1,32:8,32768,128;8,32:8,32768,128"
    bench examples/decode.attn "$decode_shapes" bf16
    bench examples/paged_decode.attn "$decode_shapes" bf16
fi

if has bench; then
    # The whole matrix: 7 variants x 1k..16k (16k tokens a batch) x D 64/128 (+96, 256 at
    # 4k) x bf16/fp16, and decode. benchmarks/matrix.py compiles in parallel first, then times
    # on every visible GPU. MATRIX_TARGET: auto (the default target, the tables of
    # docs/performance.md) or triton. Resumable: RESUME=FILE starts from the rows of an
    # earlier call's file (carried back into the tree), and only the missing ones run.
    target=${MATRIX_TARGET:-auto}
    table=matrix$([ "$target" = auto ] || echo "_$target")_$gpu
    [ -n "${RESUME:-}" ] && cp "$RESUME" "$OUT/$table.jsonl"
    python3 benchmarks/matrix.py --json "$OUT/$table.jsonl" --budget "${BUDGET_S:-540}" \
        --target "$target" --log "$OUT/${table}_log.txt" | tee -a "$OUT/bench.log"
    python3 benchmarks/matrix_table.py "$OUT/$table.jsonl" | tee "$OUT/$table.md"
    python3 benchmarks/plot.py "$OUT/$table.jsonl" --out "$OUT"
fi

if has onepass; then
    # the one-pass backward (dq_atomic) against the default two passes, per dkdv tile
    # configuration (benchmarks/backward_sweep.py --one-pass), causal and document mask
    for spec in causal document_mask; do
        timeout 280 python3 benchmarks/backward_sweep.py "examples/$spec.attn" 4,16,4096,128 bf16 \
            --one-pass 2>&1 | grep -vE "Warning|warn"
    done | tee "$OUT/onepass_$gpu.txt"
fi

if has bwdcuda; then
    # the CUDA target's sm_90a backward (ATTNCC_BACKWARD=cuda) beside the Triton backward,
    # Flex's and SDPA's, one process a spec (benchmarks/backward_backends.py, bf16, 4k)
    for case in "causal 4,16,4096,128" "fused 4,16,4096,128" "sliding_window 4,16,4096,128" \
        "gqa_causal 4,32:8,4096,128" "causal 4,32,4096,64"; do
        set -- $case
        timeout 200 python3 benchmarks/backward_backends.py "examples/$1.attn" "$2" --rounds 2 \
            2>&1 | grep -vE "Warning|warn"
    done | tee "$OUT/backward_backends_$gpu.txt"
fi

if has bwdhost; then
    # what a training step costs the host at small shapes (benchmarks/backward_host.py): CPU
    # to issue a backward, a forward requiring grad and both, attncc's two backends beside
    # FA2's, each process pinned to one core (the GPU machines' host times move 1.5-2x
    # between runs otherwise), three processes in turn; the best of each is the number. A
    # process pinned to one core that ran a CUDA backward ends in "terminate called without
    # an active exception" at exit (torch 2.11; torch alone does it too: a two-line
    # torch.autograd.grad on a CUDA tensor under taskset -c 3), after its output
    for _ in 1 2 3; do
        taskset -c 3 python3 benchmarks/backward_host.py examples/causal.attn 1,16,2048,128 \
            2,8,512,128 --anchors sdpa-flash --no-profile 2>&1 | grep -vE "Warning|warn|run_backward"
    done | tee "$OUT/backward_host_$gpu.txt"
fi

if has backward; then
    # issue 28's backward targets (benchmarks/backward.py): per variant at 4k and 8k (bf16,
    # D=128, 16k tokens), attncc's forward and backward beside Flex's, FA2's and cuDNN's
    # backward; compiles in parallel first, then times a variant a process, within BUDGET_S
    # seconds (240). BACKWARD_TARGET: auto (default) or triton (the forward's target; the
    # backward is the CUDA target's sm_90a kernel where an auto kernel's host takes it: head
    # dim 128 from 2048 keys on an H100/H200, no tile index; else Triton's). BACKWARD_RESUME=FILE
    # continues an earlier call's file.
    table=backward_$gpu
    [ -n "${BACKWARD_RESUME:-}" ] && cp "$BACKWARD_RESUME" "$OUT/$table.jsonl"
    python3 benchmarks/backward.py --json "$OUT/$table.jsonl" --budget "${BUDGET_S:-240}" \
        --target "${BACKWARD_TARGET:-auto}" --log "$OUT/${table}_log.txt" 2>&1 \
        | grep -vE "Warning|warn" | tee "$OUT/$table.txt"
fi

if has cudacol; then
    # the CUDA target's column of the Triton matrix, beside the Triton target on the same
    # shapes (resumable like `bench`, with RESUME=FILE)
    table=cuda_column_$gpu
    [ -n "${RESUME:-}" ] && cp "$RESUME" "$OUT/$table.jsonl"
    python3 benchmarks/matrix.py --column cuda --json "$OUT/$table.jsonl" \
        --budget "${BUDGET_S:-300}" --log "$OUT/${table}_log.txt" | tee -a "$OUT/bench.log"
    python3 benchmarks/matrix_table.py "$OUT/$table.jsonl" | tee "$OUT/$table.md"
fi

if has sweep; then
    # every launch configuration of a few shapes: is the candidate list right, does TMA pay
    for args in "causal 4,16,4096,128" "fused 4,16,4096,128" "decode 1,32:8,8192,128" \
                "decode 8,32:8,8192,128" "paged_decode 8,32:8,32768,128"; do
        set -- $args
        python3 benchmarks/sweep.py "examples/$1.attn" "$2" 2>&1 | grep -v Warning | tee -a "$OUT/sweep_$gpu.txt"
    done
fi

if has profile; then
    # Nsight Compute (tensor pipe, stall reasons, shared-memory conflicts, occupancy): where
    # each kernel's time goes. PROFILE_CASES: "SPEC SHAPE TARGET;..." (TARGET cuda, triton,
    # flex or cuda-backward; default: the causal prefill of all three at D=128). PROFILE_SASS=1 also samples
    # the warps' stalls per SASS instruction ($OUT/ncu_<case>_sass.csv.gz: the source page);
    # PROFILE_KERNELS names the kernels otherwise (a regex: "split" for split-KV decode)
    IFS=';' read -ra profile_cases <<< "${PROFILE_CASES:-causal 4,16,4096,128 cuda;causal 4,16,4096,128 triton;causal 4,16,4096,128 flex}"
    for profile_case in "${profile_cases[@]}"; do
        read -r p_spec p_shape p_target <<< "$profile_case"
        kernels=${PROFILE_KERNELS:-fwd|fused}
        [ "$p_target" = flex ] && kernels="tem"  # Inductor's template kernel
        [ "$p_target" = cuda-backward ] && kernels="_bwd$"
        name="${p_spec}_${p_shape//[,:]/_}_$p_target"
        extra=()
        [ -n "${PROFILE_SASS:-}" ] && extra=(--section SourceCounters --import-source no -o "/tmp/ncu_$name" -f)
        timeout 240 ncu --kernel-name regex:"$kernels" --launch-skip 3 --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
            --section MemoryWorkloadAnalysis_Tables --section Occupancy --section LaunchStats \
            --section InstructionStats --section SchedulerStats "${extra[@]}" --print-details all \
            python3 benchmarks/profile_call.py "examples/$p_spec.attn" "$p_shape" "$p_target" \
            > "$OUT/ncu_${name}_$gpu.txt" 2>&1
        if [ -n "${PROFILE_SASS:-}" ]; then
            ncu --import "/tmp/ncu_$name.ncu-rep" --print-details all > "$OUT/ncu_${name}_$gpu.txt" 2>&1
            ncu --import "/tmp/ncu_$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/ncu_${name}_sass.csv.gz"
        fi
        echo "== $name"
        grep -E "Duration|Registers Per|Achieved Occupancy|Pipe Tensor Cycles|Pipe Xu|Issue Slots Busy|Executed Instructions |Stall|Bank" "$OUT/ncu_${name}_$gpu.txt" | head -30
    done
fi

if has tests; then
    # correctness runs use the default configurations: tuning every random shape would take
    # hours. Compiling (CPU work) dominates, so the tests run in SHARDS processes side by side
    # on the GPU; each shard's log is kept, and the summary lines of all of them are printed.
    shards=${SHARDS:-8}
    work=$(mktemp -d)  # shard lists and logs: the device tool brings back few files
    # TESTS_K: a pytest -k expression selecting a part of the suite
    # (the property tests at realistic sizes compile for every drawn shape: the fuzz step's)
    ATTNCC_AUTOTUNE=0 python3 -m pytest -q -m gpu tests/gpu --ignore=tests/gpu/test_gpu_properties.py \
        ${TESTS_K:+-k "$TESTS_K"} --collect-only 2>/dev/null \
        | grep "::" > "$work/ids.txt"
    echo "$(wc -l < "$work/ids.txt") GPU tests in $shards shards"
    for i in $(seq 0 $((shards - 1))); do
        awk -v n="$shards" -v i="$i" 'NR % n == i' "$work/ids.txt" > "$work/shard$i.txt"
        # one argument per test id, a line each: parametrised ids may hold spaces
        mapfile -t shard_ids < "$work/shard$i.txt"
        ATTNCC_AUTOTUNE=0 timeout "${TESTS_TIMEOUT_S:-480}" python3 -m pytest -q -m gpu \
            -p no:cacheprovider "${shard_ids[@]}" > "$work/shard$i.log" 2>&1 &
    done
    wait
    for i in $(seq 0 $((shards - 1))); do
        echo "== shard $i: $(tr '\n' ' ' < "$work/shard$i.txt")"
        cat "$work/shard$i.log"
    done > "$OUT/gpu_tests.log"
    grep -hE "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
    grep -hE "[0-9]+ (passed|failed)" "$work"/shard*.log
fi

if has cuda; then
    # the CUDA target: every example against the reference (NVRTC compiles are cached on
    # disk per variant), then prefill and decode beside Triton and SDPA (flash)
    [ -n "${CUDA_SMOKE:-}" ] && timeout 300 python3 benchmarks/cuda_smoke.py 2>&1 | tee "$OUT/cuda_smoke.log"
    # the checks (NVRTC compiles are CPU work) run 5 at a time beside the GPU tests
    check_one() {
        sched=""
        [ "$(basename "$1")" = naive.attn ] && sched="--schedule fused"  # no naive CUDA kernels
        ATTNCC_AUTOTUNE=0 timeout 200 python3 -m attncc check "$1" --device cuda --target cuda $sched --trials 4 --max-len 512 > "/tmp/cuda_check_$(basename "$1").log" 2>&1 || echo "CHECK FAILED: $1" >> "/tmp/cuda_check_$(basename "$1").log"
    }
    export -f check_one
    ls examples/*.attn | xargs -P 5 -I{} bash -c 'check_one {}' &
    ATTNCC_AUTOTUNE=0 timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_gpu_cuda.py -k "not example_matches" > "$OUT/cuda_gpu_tests.log" 2>&1
    wait
    for spec in examples/*.attn; do echo "== $spec"; cat "/tmp/cuda_check_$(basename "$spec").log"; done > "$OUT/cuda_check.log"
    grep -E "^==|passed|FAILED|Error|error:" "$OUT/cuda_check.log" | head -60
    tail -15 "$OUT/cuda_gpu_tests.log"
    for target in cuda triton; do
        ATTNCC_AUTOTUNE=0 python3 -m attncc bench examples/causal.attn --shapes "4,16,4096,128" --target $target --against sdpa-flash --json "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/bench.log"
        ATTNCC_AUTOTUNE=0 python3 -m attncc bench examples/decode.attn --shapes "8,32:8,8192,128" --target $target --against sdpa-flash --json "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/bench.log"
    done
fi

if has check; then
    # the Triton target by name: "auto" would hand fused prefill to the CUDA target on an
    # H100/H200 (the `cuda` step checks that one). Compiling is CPU work: 6 specs at a time.
    check_triton() {
        ATTNCC_AUTOTUNE=0 timeout 400 python3 -m attncc check "$1" --device cuda --target triton --trials 4 --max-len 1024 > "/tmp/check_$(basename "$1").log" 2>&1 || echo "CHECK FAILED: $1" >> "/tmp/check_$(basename "$1").log"
    }
    export -f check_triton
    ls examples/*.attn | xargs -P 6 -I{} bash -c 'check_triton {}'
    for spec in examples/*.attn; do echo "== $spec"; cat "/tmp/check_$(basename "$spec").log"; done > "$OUT/check.log"
    grep -E "^==|passed|FAILED" "$OUT/check.log"
fi

if has kernels; then
    # the CPU suite's kernel tests that run compiled where a GPU exists (every built-in
    # function, decode, side-input dtypes, the log-sum-exp's layout, launch plans); the others
    # call the interpreter, which fails under the GPU machine's numpy (>= 2.4). Gradients are
    # the `gradients` step: on an empty cache the two compile for more than one call's 600 s
    timeout 500 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_functions.py \
        tests/kernels/test_decode.py tests/kernels/test_side_dtypes.py \
        tests/kernels/test_lse_layout.py tests/runtime/test_triton_plan.py \
        tests/runtime/test_length_family.py > "$OUT/kernel_tests.log" 2>&1
    grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/kernel_tests.log" | head -30
fi

if has gradients; then
    # tests/kernels/test_backward.py compiled: every spec's gradients, both schedules (about
    # 450 s on an empty cache, 17 s warm, H200)
    timeout 560 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_backward.py \
        > "$OUT/gradient_tests.log" 2>&1
    grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/gradient_tests.log" | head -30
fi

if has fuzz; then
    # tests/gpu/test_gpu_properties.py as a fuzz: FUZZ_DRAWS fresh draws a test (5; 0: its two
    # fixed ones) of shapes, layouts, dtypes and params for every example's forward on both
    # targets and gradients on both backward backends, 16 processes side by side; a failure's
    # draw lands in fuzz.txt as it fails (FUZZ_K: a -k expression, FUZZ_TIMEOUT_S: the limit,
    # 400). Compiling for every drawn shape dominates: 59 tests of three fixed draws took
    # 170 s (H200)
    ATTNCC_AUTOTUNE=0 ATTNCC_GPU_FUZZ=${FUZZ_DRAWS:-5} ATTNCC_GPU_FUZZ_LOG="$OUT/fuzz.txt" \
        timeout "${FUZZ_TIMEOUT_S:-400}" python3 -m pytest -q -p no:cacheprovider -n 16 \
        tests/gpu/test_gpu_properties.py ${FUZZ_K:+-k "$FUZZ_K"} > "$OUT/fuzz.log" 2>&1
    echo "fuzz: exit $?; $(tail -1 "$OUT/fuzz.log")"
    [ -s "$OUT/fuzz.txt" ] && cut -c1-300 "$OUT/fuzz.txt"
fi

if has hf; then
    # transformers end to end (benchmarks/hf_e2e.py): a random model of each family (llama,
    # qwen2, mistral, gemma2, gemma3, gpt_oss; 0.4-0.7 B parameters, bf16), batch 1, prefill
    # 2k tokens then 64 greedy steps, tokens/s for sdpa, attncc and flex_attention (eager
    # first where sdpa cannot run the family). One process a family, HF_TIMEOUT s each (rows
    # are appended as each implementation finishes, so a timeout keeps the earlier ones);
    # HF_FAMILIES narrows the list. The GPU machine has no transformers: its wheels travel in
    # .whl (benchmarks/README.md).
    if ! python3 -c "import transformers" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site:$PWD
    fi
    for family in ${HF_FAMILIES:-llama qwen2 mistral gemma2 gemma3 gpt_oss}; do
        timeout "${HF_TIMEOUT:-65}" python3 benchmarks/hf_e2e.py --family "$family" --batch 1 \
            --json "$OUT/hf_e2e_$gpu.jsonl" 2>&1 | tee -a "$OUT/hf_e2e_$gpu.log"
        [ "${PIPESTATUS[0]}" = 124 ] && echo "$family: timed out after ${HF_TIMEOUT:-65} s" | tee -a "$OUT/hf_e2e_$gpu.log"
    done
    python3 benchmarks/hf_e2e.py --table "$OUT/hf_e2e_$gpu.jsonl" | tee "$OUT/hf_e2e_$gpu.txt"
    # the integration's own tests run on the CPU in `make test`: not here, where numpy is
    # too new for Triton 3.6's interpreter (../shared/DEVICE.md)
fi

if has hfcompile; then
    # transformers under torch.compile (benchmarks/hf_e2e.py --compile): llama, batch 1, a
    # 512-token prompt and 32 greedy steps, sdpa and attncc, eager and compiled (inductor's
    # default mode) over a DynamicCache and a StaticCache; each compiled row says how many
    # graphs dynamo compiled and how many graph breaks it took
    if ! python3 -c "import transformers" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site:$PWD
    fi
    for cache in dynamic static; do
        for mode in eager default; do
            compile=()
            [ "$mode" = eager ] || compile=(--compile "$mode")
            timeout "${HF_TIMEOUT:-150}" python3 benchmarks/hf_e2e.py --family llama --batch 1 \
                --prefill 512 --decode 32 --impls sdpa,attncc --cache "$cache" "${compile[@]}" \
                --json "$OUT/hf_compile_$gpu.jsonl" 2>&1 | grep -vE "Warning|warn\(" | tee -a "$OUT/hf_compile_$gpu.log"
        done
    done
fi

if has growing; then
    # decode calls over a cache growing a token a call (benchmarks/growing_cache.py): the CPU
    # time a call of lengths attncc has not seen, beside repeated calls of one length, for
    # auto's kernels, the CUDA target's and FA2; then caches of their own (torch.cat's, a
    # transformers DynamicCache's) called by 8 layers a length
    for target in auto cuda; do
        python3 benchmarks/growing_cache.py --target "$target" 2>&1 | grep -v -i warn | tee -a "$OUT/growing_cache_$gpu.txt"
        python3 benchmarks/growing_cache.py --target "$target" --layout cat --layers 8 2>&1 | grep -v -i warn | tee -a "$OUT/growing_cache_$gpu.txt"
    done
fi

if has varlen; then
    # attncc.varlen (flash-attn's packed layout) against the document-mask kernel on the same
    # data as [1, H, total, D] and Flex's document block mask (benchmarks/varlen_speed.py):
    # random lengths of mean 128, 512 and 2048 packed to 16k tokens, H=16, D=128, bf16,
    # causal and full; rows are appended as each case finishes
    timeout "${VARLEN_TIMEOUT:-170}" python3 benchmarks/varlen_speed.py \
        --json "$OUT/varlen_speed_$gpu.jsonl" 2>&1 | tee "$OUT/varlen_speed_$gpu.txt"
fi

if has wide; then
    # head dims past 128 on the CUDA target (docs/performance.md, "Head dims past 128"): full
    # and causal at 256 and 192, and MLA's 192 / 128 (examples/mla_causal.attn), 16k tokens
    # a batch, against FA2, cuDNN and Flex
    shapes="4,16,4096,D;2,16,8192,D;1,16,16384,D"
    for spec in fused causal; do
        timeout 200 python3 -m attncc bench "examples/$spec.attn" --target cuda \
            --shapes "${shapes//D/256};${shapes//D/192}" --against sdpa-flash,sdpa-cudnn,flex \
            --json "$OUT/wide_head_dims_$gpu.jsonl" 2>&1 | tee -a "$OUT/wide_head_dims_$gpu.txt"
    done
    timeout 120 python3 -m attncc bench examples/mla_causal.attn --target cuda \
        --shapes "${shapes//D/192:128}" --against sdpa-cudnn,flex \
        --json "$OUT/wide_head_dims_$gpu.jsonl" 2>&1 | tee -a "$OUT/wide_head_dims_$gpu.txt"
fi

if has fp8; then
    # FP8 attention (docs/performance.md, "FP8 speed"): the FP8 kernel full and causal against
    # bf16 on both targets, quantisation's share, a tile sweep for the heuristic table's FP8
    # row; then the FP8 kernel tests compiled and `attncc check` of the FP8 example
    timeout 240 python3 benchmarks/fp8_speed.py --shape 1,16,8192,128 --rounds 3 \
        --configs "${FP8_CONFIGS:-64,128,4,3;128,128,8,3;64,64,4,4}" 2>&1 | grep -v Warn \
        | tee "$OUT/fp8_speed_$gpu.txt"
    # (tests/test_fp8_kernel.py is the interpreter's: CI runs it)
    timeout 200 python3 -m pytest -q tests/kernels/test_fp8.py tests/gpu/test_gpu.py -k fp8 2>&1 \
        | tail -3 | tee -a "$OUT/fp8_speed_$gpu.txt"
    for spec in fp8_block fp8_causal; do
        timeout 120 python3 -m attncc check "examples/$spec.attn" --device cuda --trials 6 2>&1 \
            | tail -4 | tee -a "$OUT/fp8_speed_$gpu.txt"
    done
fi

if has parts; then
    # issue 27's host overhead, piece by piece: each step of a repeated call's replay path
    # issued alone (benchmarks/call_parts.py), SDPA's whole call beside them
    timeout 300 python3 benchmarks/call_parts.py 2>&1 | grep -vE "Warning|warn" | tee "$OUT/call_parts_$gpu.txt"
fi

if has heuristic; then
    # issue 27: the heuristic table's launch configuration (ATTNCC_AUTOTUNE=0) against every
    # tuning candidate (benchmarks/heuristic_check.py) on the matrix's bf16 Triton prefill
    # variants at 4k (D=128) and its decode cases, outputs checked against the table's; MISS
    # where the table is over 10% slower. One process, HEURISTIC_TIMEOUT s (480); rows are
    # appended as each case finishes. HEURISTIC_CASES ("SPEC SHAPE;..." or "SPEC;...")
    # narrows it, HEURISTIC_QUICK=1 runs a handful; HEURISTIC_DTYPE (bf16, fp16, fp32) and
    # HEURISTIC_GRAPHED=1 (prefill in CUDA-graph replays: kernel time alone) as the fp32 rows
    # were measured
    timeout "${HEURISTIC_TIMEOUT:-480}" python3 benchmarks/heuristic_check.py \
        --json "$OUT/heuristic_$gpu.jsonl" ${HEURISTIC_CASES:+--cases "$HEURISTIC_CASES"} \
        ${HEURISTIC_QUICK:+--quick} --dtype "${HEURISTIC_DTYPE:-bf16}" \
        ${HEURISTIC_GRAPHED:+--graphed} 2>&1 | grep -vE "Warning|warn" | tee "$OUT/heuristic_$gpu.txt"
    [ "${PIPESTATUS[0]}" = 124 ] && echo "heuristic: timed out after ${HEURISTIC_TIMEOUT:-480} s" | tee -a "$OUT/heuristic_$gpu.txt"
fi

echo "== summary"
[ -f "$OUT/gpu_tests.log" ] && grep -hE "[0-9]+ (passed|failed)" "$OUT/gpu_tests.log"
[ -f "$OUT/hf_e2e_$gpu.txt" ] && cat "$OUT/hf_e2e_$gpu.txt"
[ -f "$OUT/heuristic_$gpu.txt" ] && grep -E "MISS|ERROR|worst|timed out" "$OUT/heuristic_$gpu.txt"
[ -f "$OUT/varlen_speed_$gpu.txt" ] && grep -vE "^(\[|W[0-9])" "$OUT/varlen_speed_$gpu.txt"
[ -f "$OUT/bench.log" ] && grep -vE "^(device|spec)" "$OUT/bench.log" | cut -c1-200
exit 0
