# SPDX-License-Identifier: MIT
"""Pure-Python helpers for the tests: 16-bit float encodings, deterministic
inputs, the fp64 reference of RMSNorm's backward and the tolerances the
kernel promises (kernels/rnk.h, rnk_verify).  No numpy."""

import math
import random
import struct

import rmsnormd

F32, F16, BF16 = rmsnormd.DTYPE_F32, rmsnormd.DTYPE_F16, rmsnormd.DTYPE_BF16
SIZE = {F32: 4, F16: 2, BF16: 2}
NAME = {F32: "f32", F16: "f16", BF16: "bf16"}


def _f32_bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def encode(dt, v):
    """v rounded to dtype dt (to nearest, ties to even), as bytes."""
    if dt == F32:
        return struct.pack("<f", v)
    if dt == F16:
        return struct.pack("<e", v)
    b = _f32_bits(v)
    if (b & 0x7F800000) == 0x7F800000:
        return struct.pack("<H", b >> 16)
    b += 0x7FFF + ((b >> 16) & 1)
    return struct.pack("<H", (b >> 16) & 0xFFFF)


def decode(dt, raw):
    if dt == F32:
        return struct.unpack("<f", raw)[0]
    if dt == F16:
        return struct.unpack("<e", raw)[0]
    return struct.unpack("<f", struct.pack("<I", struct.unpack("<H", raw)[0] << 16))[0]


def ulp(dt, v):
    """The spacing of dtype dt's values at |v|."""
    mant, min_exp = {F16: (10, -14), BF16: (7, -126), F32: (23, -126)}[dt]
    e = math.frexp(abs(v))[1] - 1 if v else min_exp
    return 2.0 ** (max(e, min_exp) - mant)


class Matrix:
    """m x n values of dtype dt stored with a row stride (elements) in a
    memoryview at a byte offset."""

    def __init__(self, mem, offset, dt, m, n, stride):
        self.mem, self.offset, self.dt = mem, offset, dt
        self.m, self.n, self.stride = m, n, stride

    def nbytes(self):
        return ((self.m - 1) * self.stride + self.n) * SIZE[self.dt] if self.m else 0

    def _at(self, i, j):
        return self.offset + (i * self.stride + j) * SIZE[self.dt]

    def set(self, i, j, v):
        k = self._at(i, j)
        self.mem[k:k + SIZE[self.dt]] = encode(self.dt, v)

    def get(self, i, j):
        k = self._at(i, j)
        return decode(self.dt, bytes(self.mem[k:k + SIZE[self.dt]]))

    def fill(self, rng, scale=1.0, mean=0.0):
        for i in range(self.m):
            for j in range(self.n):
                self.set(i, j, mean + scale * rng.gauss(0.0, 1.0))

    def rows(self):
        return [[self.get(i, j) for j in range(self.n)] for i in range(self.m)]

    def raw(self):
        """The bytes of every element, in row order (for bitwise comparisons)."""
        s = SIZE[self.dt]
        return b"".join(bytes(self.mem[self._at(i, 0):self._at(i, 0) + self.n * s])
                        for i in range(self.m))


def rstd_rows(x, eps):
    return [1.0 / math.sqrt(sum(v * v for v in row) / len(row) + eps) for row in x]


def reference(x, dy, w, rstd, weight_offset, dres):
    """fp64 dx (rows), dw (list), each dx element's cancellation floor and
    sum |dy * xhat| per column (dw's)."""
    m, n = len(x), len(x[0])
    dx, floor = [], []
    dw = [0.0] * n
    dw_abs = [0.0] * n
    for i in range(m):
        r = rstd[i]
        xhat = [v * r for v in x[i]]
        g = [dy[i][j] * (w[j] + weight_offset) if w is not None else dy[i][j]
             for j in range(n)]
        prods = [xhat[j] * g[j] for j in range(n)]
        c = sum(prods) / n
        cabs = sum(abs(p) for p in prods) / n
        row, frow = [], []
        for j in range(n):
            v = r * (g[j] - xhat[j] * c)
            extra = dres[i][j] if dres is not None else 0.0
            row.append(v + extra)
            frow.append(64 * 2.0 ** -24 * (r * (abs(g[j]) + abs(xhat[j]) * (abs(c) + cabs))
                                             + abs(extra)))
            dw[j] += dy[i][j] * xhat[j]
            dw_abs[j] += abs(dy[i][j] * xhat[j])
        dx.append(row)
        floor.append(frow)
    return dx, dw, floor, dw_abs


def check_dx(dt, got, ref, floor):
    """Issue 3's tolerances: fp32 relative norm error <= 1e-5; 16-bit within
    2 ulp of the reference (or within the cancellation floor) everywhere and
    within 1 ulp for >= 99.99 % of the elements.  Returns a list of problems."""
    problems = []
    if dt == F32:
        num = sum((g - r) ** 2 for gr, rr in zip(got, ref) for g, r in zip(gr, rr))
        den = sum(r * r for rr in ref for r in rr)
        rel = math.sqrt(num / den) if den else math.sqrt(num)
        if not rel <= 1e-5:
            problems.append("dx: relative norm error %.3g > 1e-5" % rel)
        return problems
    over1 = total = 0
    for i, (gr, rr) in enumerate(zip(got, ref)):
        for j, (g, r) in enumerate(zip(gr, rr)):
            total += 1
            rounded = decode(dt, encode(dt, r))
            err = abs(g - rounded)
            if not math.isfinite(g):
                problems.append("dx[%d][%d]: %r is not finite" % (i, j, g))
            elif err > 2 * ulp(dt, rounded) and abs(g - r) > floor[i][j]:
                problems.append("dx[%d][%d]: %r vs reference %r (%.2f ulp)"
                                % (i, j, g, r, err / ulp(dt, rounded)))
            elif err > ulp(dt, rounded) and abs(g - r) > floor[i][j]:
                over1 += 1
    if over1 > total * 1e-4:
        problems.append("dx: %d of %d elements beyond 1 ulp" % (over1, total))
    return problems[:5]


def check_dw(dt, got, ref, dw_abs):
    problems = []
    if dt == F32:
        num = sum((g - r) ** 2 for g, r in zip(got, ref))
        den = sum(r * r for r in ref)
        rel = math.sqrt(num / den) if den else math.sqrt(num)
        if not rel <= 1e-5:
            problems.append("dw: relative norm error %.3g > 1e-5" % rel)
        return problems
    for j, (g, r) in enumerate(zip(got, ref)):
        err = abs(g - r)
        if not math.isfinite(g) or (err > 2 * ulp(dt, r) and err > 64 * 2.0 ** -24 * dw_abs[j]):
            problems.append("dw[%d]: %r vs reference %r" % (j, g, r))
    return problems[:5]


def rng(seed):
    return random.Random(seed)
