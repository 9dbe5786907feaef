/*
 * Unit tests of src/core/kernels.c: the float16/bfloat16 conversions and
 * every dtype x op reduction.
 *
 * The references here are written from the definitions, not from the
 * kernels' bit tricks: integers in exact 128-bit arithmetic reduced modulo
 * 2^bits, 16-bit floats decoded with ldexp and rounded with rint() at the
 * step of their binade, float32 through double (rounding a double result of
 * + or * to float is the correctly rounded float result, since double has
 * more than 2 * 24 + 2 bits).
 */
#include <criterion/criterion.h>

#include "base/kernels.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

#define NDTYPES 10
#define NOPS 4
#define MAX_COUNT 4099
#define GUARD 8 /* elements of slack before and after each buffer */

static const char *const dtype_names[NDTYPES] = {
    "int8",   "uint8",   "int32",    "uint32",  "int64",
    "uint64", "float16", "bfloat16", "float32", "float64",
};
static const char *const op_names[NOPS] = {"sum", "prod", "min", "max"};

/* Our own table rather than weft_dtype_size(), which lives elsewhere. */
static size_t elem_size(weft_dtype t)
{
    static const size_t sizes[NDTYPES] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
    return sizes[t];
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* splitmix64: deterministic data, so a failure reproduces. */
static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* ---- reference 16-bit float conversions -------------------------------- */

static int half_is_nan(uint16_t h)
{
    return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0;
}

static int bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0;
}

/* Value of a binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static double ref_half_value(uint16_t h)
{
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(mant, -24);
    else
        v = ldexp(mant + 1024, exp - 25);
    return (h & 0x8000) ? -v : v;
}

/* Value of a bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits. */
static double ref_bf16_value(uint16_t h)
{
    int exp = (h >> 7) & 0xff, mant = h & 0x7f;
    double v;
    if (exp == 0xff)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(mant, -133);
    else
        v = ldexp(mant + 128, exp - 134);
    return (h & 0x8000) ? -v : v;
}

/* Rounds |x| to a multiple of the step of its binade (2^(e - 1 - mant_bits)
 * for |x| in [2^(e-1), 2^e)), never finer than min_step: nearest, ties to
 * even, as rint() does in the default rounding mode. */
static double ref_round(double ax, int mant_bits, int min_step_exp)
{
    int e;
    frexp(ax, &e);
    int step_exp = e - 1 - mant_bits;
    if (step_exp < min_step_exp)
        step_exp = min_step_exp;
    double step = ldexp(1.0, step_exp);
    return rint(ax / step) * step;
}

/* binary16 nearest to x (not NaN), ties to even, overflow to infinity. */
static uint16_t ref_half_round(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double r = ref_round(fabs(x), 10, -24);
    if (r > 65504.0)
        return sign | 0x7c00;
    if (r < ldexp(1.0, -14))
        return sign | (uint16_t)ldexp(r, 24);
    int e;
    frexp(r, &e); /* r in [2^(e-1), 2^e) */
    unsigned mant = (unsigned)ldexp(r, 11 - e) - 1024;
    return (uint16_t)(sign | (unsigned)(e - 1 + 15) << 10 | mant);
}

/* bfloat16 nearest to x (not NaN), ties to even, overflow to infinity. */
static uint16_t ref_bf16_round(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double r = ref_round(fabs(x), 7, -133);
    if (r > 0x1.fep127)
        return sign | 0x7f80;
    int e;
    frexp(r, &e);
    if (r < ldexp(1.0, -126))
        return sign | (uint16_t)ldexp(r, 133);
    unsigned mant = (unsigned)ldexp(r, 8 - e) - 128;
    return (uint16_t)(sign | (unsigned)(e - 1 + 127) << 7 | mant);
}

/* ---- reference reductions ---------------------------------------------- */

typedef union {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t h;
    float f;
    double d;
    unsigned char bytes[8];
} elem;

static elem load_elem(const void *p, weft_dtype t)
{
    elem e;
    memset(&e, 0, sizeof e);
    memcpy(e.bytes, p, elem_size(t));
    return e;
}

/* v modulo 2^bits as a two's complement value of that width. */
static i128 wrap_signed(i128 v, int bits)
{
    i128 m = (i128)1 << bits;
    i128 r = v % m;
    if (r < 0)
        r += m;
    if (r >= m / 2)
        r -= m;
    return r;
}

static i128 ref_int(weft_redop op, i128 x, i128 y)
{
    switch (op) {
    case WEFT_SUM:
        return x + y;
    case WEFT_PROD:
        return x * y;
    case WEFT_MIN:
        return y < x ? y : x;
    case WEFT_MAX:
        return y > x ? y : x;
    }
    return 0;
}

/* Same for uint64, whose product needs the full unsigned 128 bits. */
static uint64_t ref_u64(weft_redop op, uint64_t x, uint64_t y)
{
    switch (op) {
    case WEFT_SUM:
        return (uint64_t)((u128)x + y);
    case WEFT_PROD:
        return (uint64_t)((u128)x * y);
    case WEFT_MIN:
        return y < x ? y : x;
    case WEFT_MAX:
        return y > x ? y : x;
    }
    return 0;
}

/* MIN/MAX on two values of which neither is NaN: the second operand only
 * when strictly less (greater), so the first wins ties such as -0/+0. */
static int second_wins(weft_redop op, double x, double y)
{
    return op == WEFT_MIN ? y < x : y > x;
}

/*
 * Expected result of x OP y. *any_nan is set where any NaN is a correct
 * result (SUM and PROD leave the payload to the hardware); otherwise the
 * result must match bit for bit. MIN/MAX return the NaN operand itself (the
 * first if both are), which for 16-bit floats comes back quiet.
 */
static elem ref_reduce(weft_dtype t, weft_redop op, elem x, elem y,
                       int *any_nan)
{
    elem r;
    memset(&r, 0, sizeof r);
    *any_nan = 0;
    switch (t) {
    case WEFT_INT8:
        r.i8 = (int8_t)wrap_signed(ref_int(op, x.i8, y.i8), 8);
        break;
    case WEFT_UINT8:
        r.u8 = (uint8_t)wrap_signed(ref_int(op, x.u8, y.u8), 8);
        break;
    case WEFT_INT32:
        r.i32 = (int32_t)wrap_signed(ref_int(op, x.i32, y.i32), 32);
        break;
    case WEFT_UINT32:
        r.u32 = (uint32_t)wrap_signed(ref_int(op, x.u32, y.u32), 32);
        break;
    case WEFT_INT64:
        r.i64 = (int64_t)wrap_signed(ref_int(op, x.i64, y.i64), 64);
        break;
    case WEFT_UINT64:
        r.u64 = ref_u64(op, x.u64, y.u64);
        break;
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16: {
        int half = t == WEFT_FLOAT16;
        double dx = half ? ref_half_value(x.h) : ref_bf16_value(x.h);
        double dy = half ? ref_half_value(y.h) : ref_bf16_value(y.h);
        uint16_t quiet = half ? 0x0200 : 0x0040;
        if (op == WEFT_MIN || op == WEFT_MAX) {
            if (isnan(dx))
                r.h = x.h | quiet;
            else if (isnan(dy))
                r.h = y.h | quiet;
            else
                r.h = second_wins(op, dx, dy) ? y.h : x.h;
            break;
        }
        /* Operate in float32, then round that once to 16 bits. */
        float v = op == WEFT_SUM ? (float)(dx + dy) : (float)(dx * dy);
        if (isnan(v)) {
            *any_nan = 1;
            r.h = half ? 0x7e00 : 0x7fc0;
        } else {
            r.h = half ? ref_half_round(v) : ref_bf16_round(v);
        }
        break;
    }
    case WEFT_FLOAT32:
        if (op == WEFT_SUM || op == WEFT_PROD) {
            double v = op == WEFT_SUM ? (double)x.f + y.f : (double)x.f * y.f;
            r.f = (float)v;
            *any_nan = isnan(v);
        } else {
            /* Whole elements, so that signalling NaNs are not touched. */
            r = isnan(x.f)                  ? x
                : isnan(y.f)                ? y
                : second_wins(op, x.f, y.f) ? y
                                            : x;
        }
        break;
    case WEFT_FLOAT64:
        /* No wider type to check + and * against; this covers the loops. */
        if (op == WEFT_SUM || op == WEFT_PROD) {
            r.d = op == WEFT_SUM ? x.d + y.d : x.d * y.d;
            *any_nan = isnan(r.d);
        } else {
            r = isnan(x.d)                  ? x
                : isnan(y.d)                ? y
                : second_wins(op, x.d, y.d) ? y
                                            : x;
        }
        break;
    }
    return r;
}

static int elem_is_nan(weft_dtype t, elem e)
{
    switch (t) {
    case WEFT_FLOAT16:
        return half_is_nan(e.h);
    case WEFT_BFLOAT16:
        return bf16_is_nan(e.h);
    case WEFT_FLOAT32:
        return isnan(e.f);
    case WEFT_FLOAT64:
        return isnan(e.d);
    default:
        return 0;
    }
}

static int elem_matches(weft_dtype t, elem expected, int any_nan, elem got)
{
    if (any_nan)
        return elem_is_nan(t, got);
    return memcmp(expected.bytes, got.bytes, elem_size(t)) == 0;
}

static uint64_t elem_hex(weft_dtype t, elem e)
{
    uint64_t v = 0;
    memcpy(&v, e.bytes, elem_size(t)); /* little-endian: the low bytes */
    return v;
}

/* ---- test data ---------------------------------------------------------- */

/* Bit patterns that exercise edges: wraparound, signed zeros, infinities,
 * NaNs (quiet and signalling, both signs), subnormals, largest finite. */
static const uint64_t specials_i8[] = {0,    1,    2,    0x7f, 0x80,
                                       0x81, 0xff, 0x10, 0xfe, 0x40};
static const uint64_t specials_i32[] = {
    0,          1,          2,       0x7fffffff, 0x80000000,
    0x80000001, 0xffffffff, 0x10000, 0xfffffffe, 0x12345678};
static const uint64_t specials_i64[] = {0,
                                        1,
                                        2,
                                        0x7fffffffffffffff,
                                        0x8000000000000000,
                                        0x8000000000000001,
                                        0xffffffffffffffff,
                                        0x100000000,
                                        0xfffffffffffffffe,
                                        0xffffffff,
                                        0x123456789abcdef};
static const uint64_t specials_f16[] = {
    0x0000, 0x8000, 0x3c00, 0xbc00, 0x3c01, 0x1000, 0x7bff,
    0xfbff, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d55,
    0x0001, 0x8001, 0x03ff, 0x0400, 0x3800, 0x5bff, 0x4c00,
};
static const uint64_t specials_bf16[] = {
    0x0000, 0x8000, 0x3f80, 0xbf80, 0x3f81, 0x3b80, 0x7f7f,
    0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7faa,
    0x0001, 0x8001, 0x007f, 0x0080, 0x3f00, 0x5f7f, 0x0100,
};
static const uint64_t specials_f32[] = {
    0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x7f7fffff,
    0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
    0x7f800001, 0x7fa00000, 0x00000001, 0x80000001, 0x00800000,
    0x007fffff, 0x33800000, 0x3f800001, 0x4b800000,
};
static const uint64_t specials_f64[] = {
    0x0000000000000000, 0x8000000000000000, 0x3ff0000000000000,
    0xbff0000000000000, 0x7fefffffffffffff, 0xffefffffffffffff,
    0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000,
    0xfff8000000000000, 0x7ff0000000000001, 0x7ff4000000000000,
    0x0000000000000001, 0x8000000000000001, 0x0010000000000000,
    0x3ca0000000000000, 0x3ff0000000000001,
};

static const uint64_t *specials(weft_dtype t, size_t *n)
{
#define SPECIALS(arr) (*n = sizeof(arr) / sizeof((arr)[0]), (arr))
    switch (t) {
    case WEFT_INT8:
    case WEFT_UINT8:
        return SPECIALS(specials_i8);
    case WEFT_INT32:
    case WEFT_UINT32:
        return SPECIALS(specials_i32);
    case WEFT_INT64:
    case WEFT_UINT64:
        return SPECIALS(specials_i64);
    case WEFT_FLOAT16:
        return SPECIALS(specials_f16);
    case WEFT_BFLOAT16:
        return SPECIALS(specials_bf16);
    case WEFT_FLOAT32:
        return SPECIALS(specials_f32);
    case WEFT_FLOAT64:
        return SPECIALS(specials_f64);
    }
#undef SPECIALS
    *n = 0;
    return NULL;
}

/*
 * Fills a and b with count elements: every ordered pair of special values
 * (placed from the start, or from the end so that pairs also land in the
 * scalar tail), the rest random bits.
 */
static void fill_inputs(weft_dtype t, unsigned char *a, unsigned char *b,
                        size_t count, int from_end, uint64_t *rng)
{
    size_t es = elem_size(t), ns;
    const uint64_t *sp = specials(t, &ns);
    for (size_t i = 0; i < count; i++) {
        size_t k = from_end ? count - 1 - i : i;
        uint64_t x = rng_next(rng), y = rng_next(rng);
        if (k < ns * ns) {
            x = sp[k % ns];
            y = sp[k / ns];
        }
        memcpy(a + i * es, &x, es);
        memcpy(b + i * es, &y, es);
    }
}

/* ---- the reduction check ------------------------------------------------ */

enum { FORM_OUT_OF_PLACE, FORM_REDUCE3_IN_PLACE, FORM_REDUCE, NFORMS };
static const char *const form_names[NFORMS] = {
    "reduce3(dst, a, b)", "reduce3(a, a, b)", "reduce(a, b)"};

/* Room for MAX_COUNT 8-byte elements, GUARD elements of slack on each side
 * and a few elements of misalignment. */
#define BUF_BYTES ((MAX_COUNT + 2 * GUARD + 8) * 8)
#define GUARD_BYTE 0xa5

typedef struct {
    unsigned char *a, *b, *d;     /* inputs and out-of-place output */
    unsigned char *asave, *bsave; /* the inputs as they were before the call */
} buffers;

/*
 * One call of one form on count elements whose a, b and dst sit at the
 * given element offsets from an aligned base. Checks every element against
 * the reference, that nothing outside the output range was written, and
 * that the inputs were only read.
 */
static void check_call(weft_dtype t, weft_redop op, size_t count, int from_end,
                       const size_t offset[3], int form, buffers *bufs,
                       uint64_t *rng)
{
    size_t es = elem_size(t);
    unsigned char *a = bufs->a + (GUARD + offset[0]) * es;
    unsigned char *b = bufs->b + (GUARD + offset[1]) * es;
    unsigned char *d = bufs->d + (GUARD + offset[2]) * es;
    memset(bufs->a, GUARD_BYTE, BUF_BYTES);
    memset(bufs->b, GUARD_BYTE, BUF_BYTES);
    memset(bufs->d, GUARD_BYTE, BUF_BYTES);
    fill_inputs(t, a, b, count, from_end, rng);
    memcpy(bufs->asave, bufs->a, BUF_BYTES);
    memcpy(bufs->bsave, bufs->b, BUF_BYTES);

    unsigned char *out = a, *outbuf = bufs->a;
    switch (form) {
    case FORM_OUT_OF_PLACE:
        weft__reduce3(d, a, b, count, t, op);
        out = d;
        outbuf = bufs->d;
        break;
    case FORM_REDUCE3_IN_PLACE:
        weft__reduce3(a, a, b, count, t, op);
        break;
    case FORM_REDUCE:
        weft__reduce(a, b, count, t, op);
        break;
    }

    const unsigned char *a0 = bufs->asave + (GUARD + offset[0]) * es;
    for (size_t i = 0; i < count; i++) {
        elem x = load_elem(a0 + i * es, t);
        elem y = load_elem(b + i * es, t);
        elem got = load_elem(out + i * es, t);
        int any_nan;
        elem want = ref_reduce(t, op, x, y, &any_nan);
        if (!elem_matches(t, want, any_nan, got))
            cr_assert_fail("%s %s %s count %zu offsets %zu/%zu/%zu: element "
                           "%zu: 0x%llx OP 0x%llx gave 0x%llx, expected "
                           "%s0x%llx",
                           dtype_names[t], op_names[op], form_names[form],
                           count, offset[0], offset[1], offset[2], i,
                           (unsigned long long)elem_hex(t, x),
                           (unsigned long long)elem_hex(t, y),
                           (unsigned long long)elem_hex(t, got),
                           any_nan ? "a NaN such as " : "",
                           (unsigned long long)elem_hex(t, want));
    }

    /* Outside [out, out + count) the output buffer is as it was: guard
     * bytes, or for the in-place forms the original contents of a. */
    size_t start = (size_t)(out - outbuf);
    for (size_t k = 0; k < BUF_BYTES; k++) {
        if (k >= start && k < start + count * es)
            continue;
        unsigned char want =
            form == FORM_OUT_OF_PLACE ? GUARD_BYTE : bufs->asave[k];
        cr_assert_eq(outbuf[k], want,
                     "%s %s %s count %zu: wrote byte %lld from dst",
                     dtype_names[t], op_names[op], form_names[form], count,
                     (long long)k - (long long)start);
    }
    cr_assert(memcmp(bufs->b, bufs->bsave, BUF_BYTES) == 0,
              "%s %s %s: b modified", dtype_names[t], op_names[op],
              form_names[form]);
    if (form == FORM_OUT_OF_PLACE)
        cr_assert(memcmp(bufs->a, bufs->asave, BUF_BYTES) == 0,
                  "%s %s %s: a modified", dtype_names[t], op_names[op],
                  form_names[form]);
}

/* Every count (tails of the vector loops on both sides of a block), both
 * placements of the special pairs, aligned and misaligned, every form. */
static void check_reduce(weft_dtype t, weft_redop op)
{
    static const size_t counts[] = {0,  1,   3,   17,   63,       64,
                                    65, 127, 129, 1000, MAX_COUNT};
    static const size_t offsets[][3] = {{0, 0, 0}, {1, 3, 2}};
    buffers bufs = {malloc(BUF_BYTES), malloc(BUF_BYTES), malloc(BUF_BYTES),
                    malloc(BUF_BYTES), malloc(BUF_BYTES)};
    cr_assert(bufs.a && bufs.b && bufs.d && bufs.asave && bufs.bsave);
    uint64_t rng = 0x5eed0000u + (uint64_t)t * 16 + (uint64_t)op;

    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int from_end = 0; from_end < 2; from_end++)
            for (size_t oi = 0; oi < 2; oi++)
                for (int form = 0; form < NFORMS; form++)
                    check_call(t, op, counts[ci], from_end, offsets[oi], form,
                               &bufs, &rng);
    free(bufs.a);
    free(bufs.b);
    free(bufs.d);
    free(bufs.asave);
    free(bufs.bsave);
}

/* One test per dtype x op, so a failure names the kernel. The test names
 * are lowercase because INT8_MIN and the like are macros. */
#define REDUCE_TEST(name, dtype, opname, op)                                   \
    Test(kernels_reduce, name##_##opname)                                      \
    {                                                                          \
        check_reduce(WEFT_##dtype, WEFT_##op);                                 \
    }
#define REDUCE_TESTS(name, dtype)                                              \
    REDUCE_TEST(name, dtype, sum, SUM)                                         \
    REDUCE_TEST(name, dtype, prod, PROD)                                       \
    REDUCE_TEST(name, dtype, min, MIN)                                         \
    REDUCE_TEST(name, dtype, max, MAX)

REDUCE_TESTS(int8, INT8)
REDUCE_TESTS(uint8, UINT8)
REDUCE_TESTS(int32, INT32)
REDUCE_TESTS(uint32, UINT32)
REDUCE_TESTS(int64, INT64)
REDUCE_TESTS(uint64, UINT64)
REDUCE_TESTS(float16, FLOAT16)
REDUCE_TESTS(bfloat16, BFLOAT16)
REDUCE_TESTS(float32, FLOAT32)
REDUCE_TESTS(float64, FLOAT64)

/* ---- named edge cases ---------------------------------------------------- */

/* x OP y through the kernels, with the pair repeated over 131 elements so
 * that it goes through the vector loop and the scalar tail; every copy must
 * agree. Returns the result's bits. */
static uint64_t reduce_pair(weft_dtype t, weft_redop op, uint64_t x, uint64_t y)
{
    enum { N = 131 };
    size_t es = elem_size(t);
    unsigned char a[N * 8], b[N * 8];
    for (size_t i = 0; i < N; i++) {
        memcpy(a + i * es, &x, es);
        memcpy(b + i * es, &y, es);
    }
    weft__reduce(a, b, N, t, op);
    uint64_t r = 0;
    memcpy(&r, a, es);
    for (size_t i = 1; i < N; i++)
        cr_assert(memcmp(a, a + i * es, es) == 0,
                  "%s %s: element %zu differs from element 0", dtype_names[t],
                  op_names[op], i);
    return r;
}

#define EXPECT_PAIR(t, op, x, y, want)                                         \
    cr_expect_eq(                                                              \
        reduce_pair(WEFT_##t, WEFT_##op, (x), (y)), (uint64_t)(want),          \
        "%s %s 0x%llx, 0x%llx: got 0x%llx", #t, #op, (unsigned long long)(x),  \
        (unsigned long long)(y),                                               \
        (unsigned long long)reduce_pair(WEFT_##t, WEFT_##op, (x), (y)))

Test(kernels_edges, integer_wraparound)
{
    EXPECT_PAIR(INT8, SUM, 0x7f, 0x01, 0x80);  /* 127 + 1 = -128 */
    EXPECT_PAIR(INT8, SUM, 0x80, 0xff, 0x7f);  /* -128 + -1 = 127 */
    EXPECT_PAIR(INT8, PROD, 0x80, 0xff, 0x80); /* -128 * -1 = -128 */
    EXPECT_PAIR(INT8, PROD, 0x10, 0x10, 0x00);
    EXPECT_PAIR(INT8, MIN, 0x80, 0x7f, 0x80);
    EXPECT_PAIR(INT8, MAX, 0x80, 0x7f, 0x7f);
    EXPECT_PAIR(UINT8, SUM, 0xff, 0x01, 0x00);
    EXPECT_PAIR(UINT8, PROD, 0xff, 0xff, 0x01);
    EXPECT_PAIR(UINT8, MIN, 0x80, 0x7f, 0x7f);
    EXPECT_PAIR(INT32, SUM, 0x7fffffff, 1, 0x80000000);
    EXPECT_PAIR(INT32, PROD, 0x80000000, 0xffffffff, 0x80000000);
    EXPECT_PAIR(INT32, MIN, 0x80000000, 0x7fffffff, 0x80000000);
    EXPECT_PAIR(UINT32, SUM, 0xffffffff, 2, 1);
    EXPECT_PAIR(UINT32, PROD, 0xffffffff, 0xffffffff, 1);
    EXPECT_PAIR(UINT32, MAX, 0x80000000, 0x7fffffff, 0x80000000);
    EXPECT_PAIR(INT64, SUM, INT64_MAX, 1, (uint64_t)INT64_MIN);
    EXPECT_PAIR(INT64, PROD, (uint64_t)INT64_MIN, (uint64_t)-1,
                (uint64_t)INT64_MIN);
    EXPECT_PAIR(INT64, PROD, INT64_MAX, 2, (uint64_t)-2);
    EXPECT_PAIR(INT64, MIN, (uint64_t)INT64_MIN, INT64_MAX,
                (uint64_t)INT64_MIN);
    EXPECT_PAIR(INT64, MAX, (uint64_t)-1, 0, 0);
    EXPECT_PAIR(UINT64, PROD, UINT64_MAX, 2, UINT64_MAX - 1);
    EXPECT_PAIR(UINT64, SUM, UINT64_MAX, 1, 0);
    EXPECT_PAIR(UINT64, MIN, UINT64_MAX, 0x8000000000000000,
                0x8000000000000000);
    EXPECT_PAIR(UINT64, MAX, 0x7fffffffffffffff, 0x8000000000000000,
                0x8000000000000000);
}

Test(kernels_edges, float16_arithmetic)
{
    /* 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even, 1. */
    EXPECT_PAIR(FLOAT16, SUM, 0x3c00, 0x1000, 0x3c00);
    /* (1 + 2^-10) + 2^-11: halfway again, the even neighbour is above. */
    EXPECT_PAIR(FLOAT16, SUM, 0x3c01, 0x1000, 0x3c02);
    /* 65504 + 16 = 65520, halfway to 2^16: rounds to even, infinity. */
    EXPECT_PAIR(FLOAT16, SUM, 0x7bff, 0x4c00, 0x7c00);
    EXPECT_PAIR(FLOAT16, SUM, 0x7bff, 0x4800, 0x7bff);  /* 65504 + 8 */
    EXPECT_PAIR(FLOAT16, PROD, 0x5c00, 0x5c00, 0x7c00); /* 256 * 256 */
    EXPECT_PAIR(FLOAT16, PROD, 0xfbff, 0x4000, 0xfc00); /* -65504 * 2 */
    EXPECT_PAIR(FLOAT16, SUM, 0x0001, 0x0001, 0x0002);
    EXPECT_PAIR(FLOAT16, SUM, 0x03ff, 0x0001, 0x0400); /* into normals */
    /* 2^-24 * 0.5: halfway between 0 and 2^-24, even is 0. */
    EXPECT_PAIR(FLOAT16, PROD, 0x0001, 0x3800, 0x0000);
    EXPECT_PAIR(FLOAT16, PROD, 0x0003, 0x3800, 0x0002); /* 1.5 -> 2 */
    EXPECT_PAIR(FLOAT16, PROD, 0x8001, 0x3400, 0x8000); /* -0 underflow */
    EXPECT_PAIR(FLOAT16, SUM, 0x0000, 0x8000, 0x0000);
    EXPECT_PAIR(FLOAT16, SUM, 0x8000, 0x8000, 0x8000);
    EXPECT_PAIR(FLOAT16, MIN, 0x0000, 0x8000, 0x0000); /* first wins */
    EXPECT_PAIR(FLOAT16, MIN, 0x8000, 0x0000, 0x8000);
    EXPECT_PAIR(FLOAT16, MAX, 0x8000, 0x0000, 0x8000);
    EXPECT_PAIR(FLOAT16, MIN, 0x7e00, 0x3c00, 0x7e00); /* NaN propagates */
    EXPECT_PAIR(FLOAT16, MAX, 0x3c00, 0xfe00, 0xfe00);
    EXPECT_PAIR(FLOAT16, MIN, 0x3c00, 0x7d00, 0x7f00); /* sNaN, quieted */
    EXPECT_PAIR(FLOAT16, MAX, 0x7e01, 0xfe02, 0x7e01); /* first NaN wins */
    EXPECT_PAIR(FLOAT16, MIN, 0xfc00, 0x7c00, 0xfc00);
    cr_expect(half_is_nan(
        (uint16_t)reduce_pair(WEFT_FLOAT16, WEFT_SUM, 0x7c00, 0xfc00)));
    cr_expect(half_is_nan(
        (uint16_t)reduce_pair(WEFT_FLOAT16, WEFT_PROD, 0x7c00, 0x0000)));
}

Test(kernels_edges, bfloat16_arithmetic)
{
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even, 1. */
    EXPECT_PAIR(BFLOAT16, SUM, 0x3f80, 0x3b80, 0x3f80);
    EXPECT_PAIR(BFLOAT16, SUM, 0x3f81, 0x3b80, 0x3f82);
    EXPECT_PAIR(BFLOAT16, SUM, 0x7f7f, 0x7f7f, 0x7f80); /* overflow */
    EXPECT_PAIR(BFLOAT16, PROD, 0x7f7f, 0x3f80, 0x7f7f);
    EXPECT_PAIR(BFLOAT16, SUM, 0x0001, 0x0001, 0x0002);
    EXPECT_PAIR(BFLOAT16, SUM, 0x007f, 0x0001, 0x0080);
    EXPECT_PAIR(BFLOAT16, PROD, 0x0001, 0x3f00, 0x0000); /* tie to 0 */
    EXPECT_PAIR(BFLOAT16, PROD, 0x0003, 0x3f00, 0x0002); /* tie to 2 */
    EXPECT_PAIR(BFLOAT16, MIN, 0x0000, 0x8000, 0x0000);
    EXPECT_PAIR(BFLOAT16, MAX, 0x8000, 0x0000, 0x8000);
    EXPECT_PAIR(BFLOAT16, MIN, 0x3f80, 0x7f81, 0x7fc1); /* sNaN, quieted */
    EXPECT_PAIR(BFLOAT16, MAX, 0xffc1, 0x7fc2, 0xffc1);
    cr_expect(bf16_is_nan(
        (uint16_t)reduce_pair(WEFT_BFLOAT16, WEFT_SUM, 0x7f80, 0xff80)));
}

Test(kernels_edges, float32_float64_min_max)
{
    EXPECT_PAIR(FLOAT32, MIN, 0x00000000, 0x80000000, 0x00000000);
    EXPECT_PAIR(FLOAT32, MIN, 0x80000000, 0x00000000, 0x80000000);
    EXPECT_PAIR(FLOAT32, MAX, 0x00000000, 0x80000000, 0x00000000);
    EXPECT_PAIR(FLOAT32, MIN, 0x3f800000, 0x7fa00001, 0x7fa00001);
    EXPECT_PAIR(FLOAT32, MAX, 0xffc00001, 0x7fc00002, 0xffc00001);
    EXPECT_PAIR(FLOAT32, MAX, 0x7f800000, 0x7fc00000, 0x7fc00000);
    EXPECT_PAIR(FLOAT32, SUM, 0x7f7fffff, 0x7f7fffff, 0x7f800000);
    EXPECT_PAIR(FLOAT64, MIN, 0x8000000000000000, 0, 0x8000000000000000);
    EXPECT_PAIR(FLOAT64, MAX, 0x3ff0000000000000, 0x7ff0000000000001,
                0x7ff0000000000001);
    EXPECT_PAIR(FLOAT64, MIN, 0xfff8000000000001, 0x7ff8000000000002,
                0xfff8000000000001);
}

/* ---- conversions ----------------------------------------------------------
 */

Test(kernels_convert, half_all_patterns_round_trip)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = weft__half_to_float(h);
        uint16_t back = weft__float_to_half(f);
        if (half_is_nan(h)) {
            /* Widening is exact: same sign, payload moved up 13 bits. */
            uint32_t u = f32_bits(f);
            cr_assert(isnan(f), "half 0x%04x widened to a non-NaN", h);
            cr_assert_eq(u,
                         ((uint32_t)(h & 0x8000) << 16) | 0x7f800000 |
                             ((uint32_t)(h & 0x3ff) << 13),
                         "half NaN 0x%04x widened to 0x%08x", h, u);
            cr_assert_eq(back, h | 0x0200,
                         "half NaN 0x%04x came back as 0x%04x", h, back);
        } else {
            double want = ref_half_value(h);
            cr_assert((double)f == want && !signbit(f) == !signbit(want),
                      "half 0x%04x widened to %a, expected %a", h, (double)f,
                      want);
            cr_assert_eq(back, h, "half 0x%04x came back as 0x%04x", h, back);
        }
    }
}

Test(kernels_convert, bf16_all_patterns_round_trip)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = weft__bf16_to_float(h);
        uint16_t back = weft__float_to_bf16(f);
        if (bf16_is_nan(h)) {
            cr_assert(isnan(f), "bf16 0x%04x widened to a non-NaN", h);
            cr_assert_eq(f32_bits(f), (uint32_t)h << 16);
            cr_assert_eq(back, h | 0x0040,
                         "bf16 NaN 0x%04x came back as 0x%04x", h, back);
        } else {
            double want = ref_bf16_value(h);
            cr_assert((double)f == want && !signbit(f) == !signbit(want),
                      "bf16 0x%04x widened to %a, expected %a", h, (double)f,
                      want);
            cr_assert_eq(back, h, "bf16 0x%04x came back as 0x%04x", h, back);
        }
    }
}

/* Narrowing of f, checked against the reference (NaN: any quiet NaN with
 * f's sign). */
static void check_to_half(float f)
{
    uint16_t got = weft__float_to_half(f);
    if (isnan(f)) {
        cr_assert(half_is_nan(got) && (got & 0x0200) &&
                      (got & 0x8000) == ((f32_bits(f) >> 16) & 0x8000),
                  "float 0x%08x narrowed to 0x%04x, not a quiet NaN",
                  f32_bits(f), got);
        return;
    }
    uint16_t want = ref_half_round(f);
    cr_assert_eq(got, want,
                 "float %a (0x%08x) narrowed to half 0x%04x, "
                 "expected 0x%04x",
                 (double)f, f32_bits(f), got, want);
}

static void check_to_bf16(float f)
{
    uint16_t got = weft__float_to_bf16(f);
    if (isnan(f)) {
        cr_assert(bf16_is_nan(got) && (got & 0x0040) &&
                      (got & 0x8000) == ((f32_bits(f) >> 16) & 0x8000),
                  "float 0x%08x narrowed to 0x%04x, not a quiet NaN",
                  f32_bits(f), got);
        return;
    }
    uint16_t want = ref_bf16_round(f);
    cr_assert_eq(got, want,
                 "float %a (0x%08x) narrowed to bf16 0x%04x, "
                 "expected 0x%04x",
                 (double)f, f32_bits(f), got, want);
}

/* Every midpoint between neighbouring halves (an exact float), and the
 * floats just either side of it, both signs. */
Test(kernels_convert, half_rounding_ties)
{
    for (unsigned h = 0; h < 0x7c00; h++) {
        for (unsigned sign = 0; sign <= 0x8000; sign += 0x8000) {
            double lo = ref_half_value((uint16_t)(h | sign));
            double hi = h + 1 == 0x7c00
                            ? (sign ? -65536.0 : 65536.0)
                            : ref_half_value((uint16_t)((h + 1) | sign));
            float mid = (float)((lo + hi) / 2);
            cr_assert_eq((double)mid, (lo + hi) / 2, "midpoint not exact");
            uint16_t even = (uint16_t)(((h & 1) ? h + 1 : h) | sign);
            cr_assert_eq(weft__float_to_half(mid), even,
                         "tie %a narrowed to 0x%04x, expected 0x%04x",
                         (double)mid, weft__float_to_half(mid), even);
            check_to_half(mid);
            check_to_half(nextafterf(mid, 0.0f));
            check_to_half(nextafterf(mid, sign ? -INFINITY : INFINITY));
            check_to_half((float)lo);
        }
    }
}

Test(kernels_convert, bf16_rounding_ties)
{
    for (uint32_t h = 0; h < 0x7f80; h++) {
        for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
            float mid = f32_from_bits(((h | sign) << 16) | 0x8000);
            double lo = ref_bf16_value((uint16_t)(h | sign));
            double hi = h + 1 == 0x7f80
                            ? (sign ? -0x1p128 : 0x1p128)
                            : ref_bf16_value((uint16_t)((h + 1) | sign));
            cr_assert_eq((double)mid, (lo + hi) / 2, "midpoint not exact");
            uint16_t even = (uint16_t)(((h & 1) ? h + 1 : h) | sign);
            cr_assert_eq(weft__float_to_bf16(mid), even,
                         "tie %a narrowed to 0x%04x, expected 0x%04x",
                         (double)mid, weft__float_to_bf16(mid), even);
            check_to_bf16(mid);
            check_to_bf16(nextafterf(mid, 0.0f));
            check_to_bf16(nextafterf(mid, sign ? -INFINITY : INFINITY));
        }
    }
}

/* A sweep across all float bit patterns: every exponent, NaN payloads,
 * float subnormals. The stride is odd so that low mantissa bits vary. */
Test(kernels_convert, narrowing_sweep)
{
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
        float f = f32_from_bits((uint32_t)u);
        check_to_half(f);
        check_to_bf16(f);
    }
}

Test(kernels_convert, named_values)
{
    cr_expect_eq(weft__float_to_half(65504.0f), 0x7bff);
    cr_expect_eq(weft__float_to_half(nextafterf(65520.0f, 0.0f)), 0x7bff);
    cr_expect_eq(weft__float_to_half(65520.0f), 0x7c00);
    cr_expect_eq(weft__float_to_half(-1e10f), 0xfc00);
    cr_expect_eq(weft__float_to_half(INFINITY), 0x7c00);
    cr_expect_eq(weft__float_to_half(-INFINITY), 0xfc00);
    cr_expect_eq(weft__float_to_half(0x1p-24f), 0x0001);
    cr_expect_eq(weft__float_to_half(0x1p-25f), 0x0000); /* tie to even */
    cr_expect_eq(weft__float_to_half(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    cr_expect_eq(weft__float_to_half(0x3p-25f), 0x0002); /* tie to even */
    cr_expect_eq(weft__float_to_half(0x1p-14f - 0x1p-25f), 0x0400);
    cr_expect_eq(weft__float_to_half(-FLT_TRUE_MIN), 0x8000);
    cr_expect_eq(weft__float_to_half(-0.0f), 0x8000);
    cr_expect_eq(weft__float_to_half(1.0f + 0x1p-11f), 0x3c00);
    cr_expect_eq(weft__float_to_half(1.0f + 0x3p-11f), 0x3c02);
    /* A NaN whose payload sits below the 10 bits kept stays a NaN. */
    cr_expect_eq(weft__float_to_half(f32_from_bits(0x7f800001)), 0x7e00);
    cr_expect_eq(weft__float_to_half(f32_from_bits(0xffc00000)), 0xfe00);
    cr_expect_eq(weft__float_to_half(f32_from_bits(0x7fbfe000)), 0x7fff);

    cr_expect_eq(weft__float_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(weft__float_to_bf16(FLT_MAX), 0x7f80); /* rounds up */
    cr_expect_eq(weft__float_to_bf16(-FLT_MAX), 0xff80);
    cr_expect_eq(weft__float_to_bf16(0x1.fep127f), 0x7f7f);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0x7f7f7fff)), 0x7f7f);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0x7f7f8000)), 0x7f80);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0x3f808000)), 0x3f80);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0x3f818000)), 0x3f82);
    cr_expect_eq(weft__float_to_bf16(FLT_TRUE_MIN), 0x0000);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0x00008000)), 0x0000);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0x00018000)), 0x0002);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0x7f800001)), 0x7fc0);
    cr_expect_eq(weft__float_to_bf16(f32_from_bits(0xff80ffff)), 0xffc0);
    cr_expect_eq(weft__float_to_bf16(INFINITY), 0x7f80);

    cr_expect_eq(f32_bits(weft__half_to_float(0x7bff)), f32_bits(65504.0f));
    cr_expect_eq(f32_bits(weft__half_to_float(0x0001)), f32_bits(0x1p-24f));
    cr_expect_eq(f32_bits(weft__half_to_float(0x8000)), 0x80000000u);
    cr_expect_eq(f32_bits(weft__bf16_to_float(0xff80)), 0xff800000u);
}

/* ---- validity and degenerate calls ------------------------------------- */

Test(kernels_misc, validity)
{
    for (int t = -3; t < NDTYPES + 3; t++)
        cr_expect_eq(weft__dtype_valid(t), t >= 0 && t < NDTYPES, "dtype %d",
                     t);
    for (int op = -3; op < NOPS + 3; op++)
        cr_expect_eq(weft__op_valid(op), op >= 0 && op < NOPS, "op %d", op);
    cr_expect_eq(weft__dtype_valid(WEFT_INT8), 1);
    cr_expect_eq(weft__dtype_valid(WEFT_FLOAT64), 1);
    cr_expect_eq(weft__op_valid(WEFT_SUM), 1);
    cr_expect_eq(weft__op_valid(WEFT_MAX), 1);
}

Test(kernels_misc, zero_count_and_invalid_arguments)
{
    for (int t = 0; t < NDTYPES; t++)
        for (int op = 0; op < NOPS; op++) {
            weft__reduce(NULL, NULL, 0, (weft_dtype)t, (weft_redop)op);
            weft__reduce3(NULL, NULL, NULL, 0, (weft_dtype)t, (weft_redop)op);
        }
    uint32_t d[4] = {1, 2, 3, 4}, s[4] = {5, 6, 7, 8};
    weft__reduce(d, s, 4, (weft_dtype)NDTYPES, WEFT_SUM);
    weft__reduce(d, s, 4, WEFT_UINT32, (weft_redop)NOPS);
    weft__reduce3(d, s, s, 4, (weft_dtype)-1, WEFT_SUM);
    weft__reduce3(d, s, s, 4, WEFT_UINT32, (weft_redop)-1);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(d[i], (uint32_t)(i + 1), "invalid call wrote element %d",
                     i);
}
