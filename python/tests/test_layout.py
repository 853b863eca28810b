# SPDX-License-Identifier: MIT
"""The ctypes mirrors of the public structs match the C compiler's layout.

A C program generated from the mirrors' field lists is compiled against the
real public header and prints sizeof of each struct and offsetof of each
field; every number must equal ctypes'.  A field renamed on either side
fails to compile; one added, removed, reordered or retyped changes an offset
or a size.
"""

import ctypes
import os
import shutil
import subprocess

import pytest

from rmsnormd import _lib

from conftest import BUILD, REPO


def _header_flags():
    public = os.path.join(BUILD, "include")
    if os.path.exists(os.path.join(public, "rmsnorm_client.h")):
        return ["-I" + public]
    return ["-I" + os.path.join(REPO, "client"), "-I" + os.path.join(REPO, "proto")]


def _program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "rmsnorm_client.h"',
             "int main(void) {"]
    for cname, cls in _lib.STRUCTS.items():
        lines.append('    printf("%%s %%zu\\n", "%s", sizeof(%s));' % (cname, cname))
        for field, _ in cls._fields_:
            lines.append('    printf("%%s %%zu\\n", "%s.%s", offsetof(%s, %s));'
                         % (cname, field, cname, field))
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_struct_layout_matches_c(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to read the header's layout with")
    src = tmp_path / "layout.c"
    exe = tmp_path / "layout"
    src.write_text(_program())
    r = subprocess.run([cc, "-std=c11", "-Wall", "-Werror"] + _header_flags()
                       + [str(src), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, "the mirrors name fields the header lacks:\n" + r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    c_side = dict(line.rsplit(" ", 1) for line in out.splitlines())

    py_side = {}
    for cname, cls in _lib.STRUCTS.items():
        py_side[cname] = ctypes.sizeof(cls)
        for field, _ in cls._fields_:
            py_side["%s.%s" % (cname, field)] = getattr(cls, field).offset
    mismatches = ["%s: C %s, ctypes %d" % (k, c_side[k], v)
                  for k, v in py_side.items() if int(c_side[k]) != v]
    assert not mismatches, "layout differs:\n" + "\n".join(mismatches)
    assert len(c_side) == len(py_side)


def test_bwd_pack_gives_the_structs_bytes():
    # rmsnormd.torch builds BwdArgs with one BWD_PACK.pack call: the same
    # bytes as setting the fields one by one, field for field.
    assert _lib.BWD_PACK is not None and _lib.BWD_PACK.size == ctypes.sizeof(_lib.BwdArgs)
    values, ref = [], _lib.BwdArgs()
    for i, (field, ctype) in enumerate(_lib.BwdArgs._fields_):
        v = _lib.BWD_SIZE if field == "struct_size" else (
            0.5 + i if ctype is ctypes.c_float else (1 << 40) + 8 * i)
        if ctype is ctypes.c_int:
            v = i
        values.append(v)
        setattr(ref, field, v)
    packed = _lib.BWD_PACK.pack(*values)
    assert packed == bytes(ref)
    back = _lib.BwdArgs.from_buffer_copy(packed)
    assert [getattr(back, f) for f, _ in _lib.BwdArgs._fields_] == \
        [getattr(ref, f) for f, _ in _lib.BwdArgs._fields_]
