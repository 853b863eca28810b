#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Copy what a run on a GPU host needs out of a build directory, stripped,
# into DEST (same layout: DEST/rmsnormd, DEST/tests/gpu/..., DEST/bench/...),
# so that it travels small.  Usage: tests/gpu/pack_build.sh BUILD DEST
set -eu
build=${1:?usage: pack_build.sh BUILD DEST}
dest=${2:?usage: pack_build.sh BUILD DEST}
rm -rf "$dest"
mkdir -p "$dest/tests/gpu" "$dest/tests/integration" "$dest/bench"
cp -P "$build"/rmsnormd "$build"/rmsnormctl "$build"/librmsnorm_client.so* "$dest/"
for d in tests/gpu tests/integration bench; do
    for f in "$build/$d"/*; do
        [ -f "$f" ] && [ -x "$f" ] && cp "$f" "$dest/$d/"
    done
done
find "$dest" -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true
strip --strip-unneeded "$dest"/librmsnorm_client.so.*.* 2>/dev/null || true
du -sh "$dest"
