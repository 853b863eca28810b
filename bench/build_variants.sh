#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build bench_kernel once per set of kernel knobs (-D flags of kernels/, given
# to both the C and the CUDA compiler), for comparing variants side by side in
# one GPU run.  Every build has the benchmark-only variants compiled in.
# Usage: bench/build_variants.sh DEST NAME='FLAGS' [NAME='FLAGS' ...]
#   e.g. bench/build_variants.sh .dev/v base='' s8='-DRNK_MAX_STRIPES=8'
# Writes DEST/bench_kernel.NAME; NVCC_GENCODE defaults to sm_90 alone here.
# With TESTS=1 also DEST/NAME/tests/gpu/{test_kernel_gpu,prog_hog,prog_probe},
# the GPU tests of the same build (for tests/gpu/device_run.sh DEST/NAME).
set -euo pipefail
dest=${1:?usage: build_variants.sh DEST NAME=FLAGS ...}
shift
mkdir -p "$dest"
gencode=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}
for spec in "$@"; do
    name=${spec%%=*}
    flags=${spec#*=}
    b=build/var-$name
    # make does not see a change of flags: a directory built with other
    # flags under the same NAME (or with unknown ones) is built again from
    # scratch.
    if [ -d "$b" ] && { [ ! -f "$b/.variant-flags" ] ||
        [ "$(cat "$b/.variant-flags")" != "$flags" ]; }; then
        rm -rf "$b"
    fi
    mkdir -p "$b"
    printf '%s' "$flags" >"$b/.variant-flags"
    make -s -j2 BUILD="$b" CFLAGS="$flags" NVCCFLAGS="-DRNK_BENCH_VARIANTS=1 $flags" \
        NVCC_GENCODE="$gencode" "$b/bench/bench_kernel"
    cp "$b/bench/bench_kernel" "$dest/bench_kernel.$name"
    if [ "${TESTS:-0}" = 1 ]; then
        t="$b/tests/gpu"
        make -s -j2 BUILD="$b" CFLAGS="$flags" NVCCFLAGS="-DRNK_BENCH_VARIANTS=1 $flags" \
            NVCC_GENCODE="$gencode" "$t/test_kernel_gpu" "$t/prog_hog" "$t/prog_probe"
        mkdir -p "$dest/$name/tests/gpu"
        cp "$t/test_kernel_gpu" "$t/prog_hog" "$t/prog_probe" "$dest/$name/tests/gpu/"
    fi
    echo "$name: $flags"
done
