#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Instruction mix of the loops of the fused kernel, from its SASS, on a
machine without a GPU: the count a row costs, to cut before a GPU run.

  cuobjdump -sass -arch sm_90 build/obj/kernels/cuda_bwd.cu.o > k.sass
  bench/sass_loops.py k.sass [FUNCTION_REGEX] [--min-f2fp N] [--max-len N]

cuobjdump and nvdisasm come with the CUDA Toolkit; where the toolkit lacks
them, the wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (PyPI)
carry them (bin/).  For each function whose mangled name matches the regex
(default: the bf16 fast kernels with an fp32 weight), every backward branch
is taken as a loop; loops whose body packs dx (F2FP, at least --min-f2fp of
them, default 4) are the row loops, printed with their length and the most
frequent opcodes.  A row loop's length divided by the elements a thread
holds (NV * 8 for bf16) is the instructions per element.
"""
import re
import sys


def parse(path):
    funcs = {}
    name = None
    for line in open(path, errors="replace"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            funcs[name] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and name:
            funcs[name].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


def opcode(text):
    return re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0].split(".")[0]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(zip(sys.argv[1:], sys.argv[2:]))
    if not args:
        print(__doc__)
        return 2
    rx = re.compile(args[1] if len(args) > 1 else r"fast_kernelI13__nv_bfloat16fLi[124]E")
    min_f2fp = int(opts.get("--min-f2fp", 4))
    max_len = int(opts.get("--max-len", 1500))
    for name, ins in parse(args[0]).items():
        if not rx.search(name):
            continue
        at = {a: i for i, (a, _) in enumerate(ins)}
        print(f"{name}: {len(ins)} instructions")
        for i, (a, t) in enumerate(ins):
            m = re.search(r"BRA\S*\s+.*?0x([0-9a-f]+)", t)
            if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in at:
                continue
            body = ins[at[int(m.group(1), 16)]:i + 1]
            ops = {}
            for _, tt in body:
                ops[opcode(tt)] = ops.get(opcode(tt), 0) + 1
            if ops.get("F2FP", 0) < min_f2fp or len(body) > max_len:
                continue
            top = sorted(ops.items(), key=lambda x: -x[1])[:16]
            print(f"  loop {body[0][0]:#x}-{a:#x}: {len(body)} instructions; " +
                  " ".join(f"{k}:{v}" for k, v in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
