#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The kernel benchmark against Quack on a GPU host without package access,
# in the second of the two device calls that bring Quack's wheels there
# (../shared/tools/quack-wheels.sh DIR makes DIR.1 and DIR.2; the first call
# copies DIR.1's part to /tmp/qw, this one carries DIR.2):
#   bench/run_kernel_quack.sh DIR.2 BUILD OUT [--quick]
# It joins the split wheel, installs the wheels into /tmp/site, then runs
# bench/run_kernel.sh BUILD OUT (PyTorch eager and compiled, Quack, ours),
# and keeps OUT to a few files (a remote run brings back 8 at most): the
# tables, bench.log, accuracy.log and the plot, with torch.log and the two
# accuracy CSVs in extra.tar.gz; the inputs the accuracy runs shared are
# removed.
set -euo pipefail
wheels=${1:?usage: run_kernel_quack.sh WHEELS_DIR BUILD OUT [--quick]}
build=${2:?usage: run_kernel_quack.sh WHEELS_DIR BUILD OUT [--quick]}
out=${3:?usage: run_kernel_quack.sh WHEELS_DIR BUILD OUT [--quick]}
here=$(cd "$(dirname "$0")" && pwd)
big=$(cat "$wheels/bigname")
[ -f /tmp/qw/part.aa ] || { echo "run_kernel_quack: /tmp/qw/part.aa is missing (the first call copies it)" >&2; exit 2; }
cat /tmp/qw/part.aa "$wheels/part.ab" > "/tmp/qw/$big"
rm -f /tmp/qw/part.aa
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheels"/*.whl /tmp/qw/*.whl
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'from quack.rmsnorm import rmsnorm_bwd; print("quack imports")'
bash "$here/run_kernel.sh" "$build" "$out" "${4:-}"
(cd "$out" && tar czf extra.tar.gz torch.log acc/acc_torch.csv acc/acc_ours.csv 2>/dev/null || true)
rm -rf "$out/acc" "$out/torch.log"
ls "$out"
