/* SPDX-License-Identifier: MIT */
/*
 * decode_walk.c - the decoder's field walker (rnp_dec.h): typed values and
 * maps of known fields over the allocation-free reader of rnp_mp.h.  Pure:
 * no I/O, no logging, no allocation.
 *
 * Two passes.  rnp_dec_begin first checks the message's structure with
 * rnp_mp_scan (one object, counts against the bytes left, depth, no
 * trailing bytes); the typed pass then reads the fields in place.  Every
 * error names its field, and names from the wire are quoted through
 * rnp_dec_printable so that a message stays one printable line.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rnp_dec.h"

int rnp_dec_begin(rnp_dctx *d, const void *buf, size_t len, bool strict, rnp_error *err)
{
    int rc;
    d->err = err, d->strict = strict;
    if (len > RNP_MAX_MSG)
        return rnp_fail(err, RN_TOO_BIG, "message: %zu bytes, limit %u", len, RNP_MAX_MSG);
    if ((rc = rnp_mp_scan(buf, len, RNP_MAX_DEPTH, err)) != 0)
        return rc;
    rnp_mp_init(&d->r, buf, len);
    return 0;
}

void rnp_dec_printable(char *dst, size_t cap, const uint8_t *s, uint32_t len)
{
    size_t o = 0;
    for (uint32_t k = 0; k < len && o + 4 < cap; k++)
        dst[o++] = (s[k] >= 0x20 && s[k] < 0x7f) ? (char)s[k] : '?';
    if (len > 0 && o + 4 >= cap && o < len)
        dst[o++] = '.', dst[o++] = '.', dst[o++] = '.';
    dst[o] = '\0';
}

int rnp_dec_fail(rnp_dctx *d, int code, const char *path, const char *fmt, ...)
{
    char tail[RNP_MAX_ERRMSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    return rnp_fail(d->err, code, "%s: %s", path, tail);
}

void rnp_dec_join(char *dst, const char *path, const char *key)
{
    size_t o = 0;
    for (const char *s = path; *s && o < RNP_PATH_MAX - 1; s++)
        dst[o++] = *s;
    if (*path && o < RNP_PATH_MAX - 1)
        dst[o++] = '.';
    for (const char *s = key; *s && o < RNP_PATH_MAX - 1; s++)
        dst[o++] = *s;
    dst[o] = '\0';
}

int rnp_dec_wrong_type(rnp_dctx *d, const char *path, const char *want)
{
    return rnp_dec_fail(d, RN_BAD_TYPE, path, "expected %s, got %s", want,
                        rnp_mp_kind_name(rnp_mp_peek(&d->r)));
}

/* ---- typed values ----------------------------------------------------------- */

int rnp_dec_uint(rnp_dctx *d, const char *path, uint64_t max, uint64_t *v)
{
    uint64_t x;
    if (!rnp_mp_read_uint(&d->r, &x))
        return rnp_dec_wrong_type(d, path, max == UINT64_MAX ? "unsigned integer"
                                                             : "unsigned 32-bit integer");
    if (x > max)
        return rnp_dec_fail(d, RN_BAD_TYPE, path, "%llu does not fit in an unsigned %d-bit integer",
                            (unsigned long long)x, max == UINT32_MAX ? 32 : 64);
    *v = x;
    return 0;
}

int rnp_dec_u32(rnp_dctx *d, const char *path, uint32_t *v)
{
    uint64_t x = 0;
    int rc = rnp_dec_uint(d, path, UINT32_MAX, &x);
    if (rc == 0)
        *v = (uint32_t)x;
    return rc;
}

int rnp_dec_u64(rnp_dctx *d, const char *path, uint64_t *v)
{
    return rnp_dec_uint(d, path, UINT64_MAX, v);
}

int rnp_dec_i32(rnp_dctx *d, const char *path, int32_t *v)
{
    int64_t x;
    if (!rnp_mp_read_int(&d->r, &x))
        return rnp_dec_wrong_type(d, path, "integer");
    if (x < INT32_MIN || x > INT32_MAX)
        return rnp_dec_fail(d, RN_BAD_TYPE, path, "%lld does not fit in a signed 32-bit integer",
                            (long long)x);
    *v = (int32_t)x;
    return 0;
}

int rnp_dec_bool(rnp_dctx *d, const char *path, bool *v)
{
    if (!rnp_mp_read_bool(&d->r, v))
        return rnp_dec_wrong_type(d, path, "boolean");
    return 0;
}

int rnp_dec_f32(rnp_dctx *d, const char *path, float *v)
{
    double x;
    if (!rnp_mp_read_float(&d->r, &x))
        return rnp_dec_wrong_type(d, path, "float");
    float f = (float)x;
    if (!isfinite(f))
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "not a finite float32 value");
    *v = f;
    return 0;
}

int rnp_dec_str(rnp_dctx *d, const char *path, char *dst, size_t cap, bool nonempty)
{
    const uint8_t *s;
    uint32_t len;
    if (!rnp_mp_read_str(&d->r, &s, &len))
        return rnp_dec_wrong_type(d, path, "string");
    if (len >= cap)
        return rnp_dec_fail(d, RN_TOO_BIG, path, "%u bytes, limit %zu", len, cap - 1);
    if (nonempty && len == 0)
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "must not be empty");
    if (memchr(s, 0, len))
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "contains a NUL byte");
    memcpy(dst, s, len);
    dst[len] = '\0';
    return 0;
}

int rnp_dec_bin(rnp_dctx *d, const char *path, uint8_t *dst, size_t size)
{
    const uint8_t *s;
    uint32_t len;
    if (!rnp_mp_read_bin(&d->r, &s, &len))
        return rnp_dec_wrong_type(d, path, "binary");
    if (len > size)
        return rnp_dec_fail(d, RN_TOO_BIG, path, "binary of %u bytes, expected %zu", len, size);
    if (len < size)
        return rnp_dec_fail(d, RN_BAD_TYPE, path, "binary of %u bytes, expected %zu", len, size);
    memcpy(dst, s, size);
    return 0;
}

int rnp_dec_session(rnp_dctx *d, const char *path, rnp_session *s)
{
    return rnp_dec_bin(d, path, s->b, RNP_SESSION_BYTES);
}

int rnp_dec_handles(rnp_dctx *d, const char *path, uint32_t *n, uint8_t (*h)[RNP_IPC_HANDLE_BYTES])
{
    uint32_t cnt;
    char sub[RNP_PATH_MAX];
    int rc;
    if (!rnp_mp_read_array(&d->r, &cnt))
        return rnp_dec_wrong_type(d, path, "array");
    if (cnt > RNP_MAX_EVENTS)
        return rnp_dec_fail(d, RN_TOO_BIG, path, "%u handles, limit %d", cnt, RNP_MAX_EVENTS);
    if (cnt == 0)
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "needs at least one handle");
    for (uint32_t i = 0; i < cnt; i++) {
        snprintf(sub, sizeof sub, "%s[%u]", path, i);
        if ((rc = rnp_dec_bin(d, sub, h[i], RNP_IPC_HANDLE_BYTES)) != 0)
            return rc;
    }
    *n = cnt;
    return 0;
}

int rnp_dec_capture(rnp_dctx *d, const char *path, rnp_mp *at)
{
    *at = d->r;
    /* Cannot fail after a scan; kept so that the reader never trusts it. */
    return rnp_mp_skip(&d->r) ? 0 : rnp_dec_fail(d, RN_MALFORMED, path, "truncated value");
}

int rnp_dec_body(rnp_dctx *d, const rnp_mp *body, uint32_t op, bool request,
                 int (*dec)(rnp_dctx *d, void *msg), void *msg)
{
    if (!body)
        return rnp_op_has_body(op, request)
                   ? rnp_dec_fail(d, RN_MISSING_FIELD, "body", "required for %s", rnp_op_name(op))
                   : 0;
    d->r = *body;
    return dec(d, msg);
}

/* ---- maps ------------------------------------------------------------------ */

int rnp_dec_map_open(rnp_dctx *d, rnp_mapit *it, const char *path, const char *const *names,
                     int nnames)
{
    it->path = path, it->names = names, it->nnames = nnames, it->seen = 0;
    if (!rnp_mp_read_map(&d->r, &it->left))
        return rnp_dec_wrong_type(d, path, "map");
    return 0;
}

/*
 * Whether the unknown key k, whose value is next in d, appears again among
 * the map's remaining entries.  A key given twice is RN_DUPLICATE_FIELD
 * whether or not it is known; a known key is caught at its second
 * occurrence by the seen bits, an unknown one only here, since the walk ends
 * at its first occurrence.  One pass over the rest of the map (on a copy of
 * the reader), done once: the map's decoding fails either way.
 */
static bool repeated_later(const rnp_dctx *d, const rnp_mapit *it, const uint8_t *k, uint32_t klen)
{
    rnp_mp r = d->r;
    if (!rnp_mp_skip(&r))
        return false;
    for (uint32_t left = it->left; left > 0; left--) {
        const uint8_t *k2;
        uint32_t klen2;
        if (rnp_mp_read_str(&r, &k2, &klen2)) {
            if (klen2 == klen && memcmp(k2, k, klen) == 0)
                return true;
        } else if (!rnp_mp_skip(&r)) {
            return false;
        }
        if (!rnp_mp_skip(&r))
            return false;
    }
    return false;
}

int rnp_dec_map_next(rnp_dctx *d, rnp_mapit *it, int *idx)
{
    char sub[RNP_PATH_MAX];
    while (it->left > 0) {
        const uint8_t *k;
        uint32_t klen;
        it->left--;
        if (!rnp_mp_read_str(&d->r, &k, &klen))
            return rnp_dec_fail(d, RN_BAD_TYPE, it->path, "map key must be a string, got %s",
                                rnp_mp_kind_name(rnp_mp_peek(&d->r)));
        for (int i = 0; i < it->nnames; i++) {
            if (strlen(it->names[i]) == klen && memcmp(it->names[i], k, klen) == 0) {
                if (it->seen & RNP_BIT(i)) {
                    rnp_dec_join(sub, it->path, it->names[i]);
                    return rnp_dec_fail(d, RN_DUPLICATE_FIELD, sub, "appears twice");
                }
                it->seen |= RNP_BIT(i);
                *idx = i;
                return 0;
            }
        }
        char key[40];
        rnp_dec_printable(key, sizeof key, k, klen);
        if (d->strict) {
            rnp_dec_join(sub, it->path, key);
            if (repeated_later(d, it, k, klen))
                return rnp_dec_fail(d, RN_DUPLICATE_FIELD, sub, "appears twice");
            return rnp_dec_fail(d, RN_UNKNOWN_FIELD, sub, "unknown field");
        }
        if (!rnp_mp_skip(&d->r)) /* cannot fail after a scan; kept for safety */
            return rnp_dec_fail(d, RN_MALFORMED, it->path, "truncated value");
    }
    *idx = -1;
    return 0;
}

int rnp_dec_require(rnp_dctx *d, const char *path, const char *const *names, uint32_t seen,
                    uint32_t req)
{
    uint32_t missing = req & ~seen;
    if (!missing)
        return 0;
    char sub[RNP_PATH_MAX];
    rnp_dec_join(sub, path, names[__builtin_ctz(missing)]);
    return rnp_dec_fail(d, RN_MISSING_FIELD, sub, "required field is missing");
}

int rnp_dec_map(rnp_dctx *d, const char *path, const char *const *names, int nnames,
                uint32_t required, rnp_dec_field_fn field, void *obj, uint32_t *seen)
{
    rnp_mapit it;
    int rc, idx;
    char sub[RNP_PATH_MAX];
    if ((rc = rnp_dec_map_open(d, &it, path, names, nnames)) != 0)
        return rc;
    while ((rc = rnp_dec_map_next(d, &it, &idx)) == 0 && idx >= 0) {
        rnp_dec_join(sub, path, names[idx]);
        if ((rc = field(d, obj, idx, sub)) != 0)
            return rc;
    }
    if (rc || (rc = rnp_dec_require(d, path, names, it.seen, required)) != 0)
        return rc;
    if (seen)
        *seen = it.seen;
    return 0;
}

int rnp_dec_empty(rnp_dctx *d, const char *path)
{
    rnp_mapit it;
    int rc, idx;
    if ((rc = rnp_dec_map_open(d, &it, path, NULL, 0)) != 0)
        return rc;
    return rnp_dec_map_next(d, &it, &idx);
}

void rnp_dec_peek_header(const void *buf, size_t len, uint32_t *op, uint64_t *id)
{
    rnp_mp r;
    uint32_t n;
    bool got_op = false, got_id = false;
    *op = 0, *id = 0;
    rnp_mp_init(&r, buf, len);
    if (!rnp_mp_read_map(&r, &n))
        return;
    for (uint32_t i = 0; i < n && !(got_op && got_id); i++) {
        const uint8_t *k;
        uint32_t klen;
        uint64_t v;
        if (!rnp_mp_read_str(&r, &k, &klen))
            return;
        if (klen == 2 && memcmp(k, "op", 2) == 0 && !got_op && rnp_mp_read_uint(&r, &v)) {
            got_op = true;
            if (v <= UINT32_MAX)
                *op = (uint32_t)v;
        } else if (klen == 2 && memcmp(k, "id", 2) == 0 && !got_id && rnp_mp_read_uint(&r, &v)) {
            got_id = true;
            *id = v;
        } else if (!rnp_mp_skip(&r)) {
            return;
        }
    }
}
