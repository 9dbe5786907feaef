/*
 * Reduction kernels and 16-bit float conversions.
 *
 * The reductions run on every received frame, so each dtype x op pair has
 * its own tight loop, written so that GCC (from -O2) and Clang vectorise it
 * for baseline x86-64 (SSE2), with no -march and no intrinsics:
 *  - every element operation is a branch-free expression: MIN/MAX are
 *    selects, and the float16/bfloat16 conversions are integer bit
 *    manipulation plus one float addition, with no data-dependent shifts;
 *  - the only inputs that may overlap (dst and a, which may be equal) are
 *    covered by an ivdep pragma, because an equal pair carries no dependence
 *    from one iteration to the next;
 *  - the data is processed in blocks of KERNEL_BLOCK elements, each by a
 *    loop of constant trip count. GCC 12 at -O2 uses the "very cheap" cost
 *    model, which only vectorises a loop when no scalar iterations are
 *    left over and the vector loop pays off even counting the overhead; a
 *    constant trip count that is a multiple of the vector length is what it
 *    accepts, even for 2-lane (64-bit) vectors. The tail, shorter than a
 *    block, runs in a plain loop (which -O3 vectorises too).
 * scripts/check-vectorized checks the compiler's reports for every kernel.
 */
#include "base/kernels.h"

#include <math.h>
#include <string.h>

/* Elements per main-loop step: a multiple of the vectorisation factor of
 * every kernel (16 one-byte lanes with SSE2, 64 with AVX-512). */
#define KERNEL_BLOCK 64

#if defined(__clang__)
/* Clang's equivalent of ivdep also forces vectorisation, and warns where it
 * cannot (e.g. under the sanitizers): the pragma is a hint, not a demand. */
#pragma clang diagnostic ignored "-Wpass-failed"
#define KERNEL_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define KERNEL_IVDEP _Pragma("GCC ivdep")
#else
#define KERNEL_IVDEP
#endif

/* Bit casts; memcpy is the defined way and compiles to nothing. */
static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 * Branch-free select: x where mask is all ones, y where it is zero. The
 * conversions below compute every case and pick one with these rather than
 * with ?:, because GCC would sink each case's float arithmetic into its own
 * branch and then refuse to if-convert (speculate) an operation that may
 * raise a floating-point exception, leaving a loop it cannot vectorise.
 */
static inline uint32_t mask_if(int cond) { return 0u - (uint32_t)cond; }

static inline uint32_t select_u32(uint32_t mask, uint32_t x, uint32_t y)
{
    return y ^ ((x ^ y) & mask);
}

/*
 * binary16 -> binary32, exact:
 *  - normal: move exponent and mantissa into place and rebias the exponent
 *    (15 -> 127);
 *  - infinity/NaN: exponent becomes 255, the payload moves with the
 *    mantissa, so a NaN stays a NaN with the same payload;
 *  - zero/subnormal: the value is mant * 2^-24. Putting the mantissa under
 *    the exponent of 2^-14 gives 2^-14 + mant * 2^-24, and subtracting
 *    2^-14 leaves the value exactly (Sterbenz), without a variable shift,
 *    which SSE2 does not have.
 */
static inline float half_decode(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t exp = mag & (0x7c00u << 13);
    uint32_t normal = mag + ((uint32_t)(127 - 15) << 23);
    uint32_t infnan = mag + ((uint32_t)(255 - 31) << 23);
    float two_m14 = f32_from_bits((uint32_t)(127 - 14) << 23);
    uint32_t sub = f32_bits(f32_from_bits(mag + f32_bits(two_m14)) - two_m14);
    uint32_t r = select_u32(mask_if(exp == (0x7c00u << 13)), infnan,
                            select_u32(mask_if(exp == 0), sub, normal));
    return f32_from_bits(r | sign);
}

/*
 * binary32 -> binary16, round to nearest even (after F. Giesen's
 * float_to_half_fast3_rtne):
 *  - |f| >= 2^16, infinity or NaN: infinity, or a quiet NaN with the top
 *    payload bits. Finite values from 65520 up already round to infinity
 *    in the normal case, so 2^16 is merely a convenient bound;
 *  - |f| < 2^-14 (half subnormal or zero): adding 0.5f lines the half's
 *    mantissa up with the float's last bit (the ulp of 0.5f is 2^-24, the
 *    half subnormal step), so the FPU's own round-to-nearest-even does the
 *    rounding; the low mantissa bits are then the result, and a carry into
 *    the exponent correctly yields the smallest normal half;
 *  - otherwise: rebias the exponent and round the 13 dropped bits by adding
 *    0xfff plus the lowest kept bit (ties go to even); a carry out of the
 *    mantissa bumps the exponent, up to infinity.
 */
static inline uint16_t half_encode(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t infnan = select_u32(mask_if(a > 0x7f800000u),
                                 0x7e00u | ((a >> 13) & 0x3ffu), 0x7c00u);
    float half_magic = 0.5f;
    uint32_t sub =
        f32_bits(f32_from_bits(a) + half_magic) - f32_bits(half_magic);
    uint32_t normal =
        (a - ((uint32_t)(127 - 15) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t r = select_u32(
        mask_if(a >= ((uint32_t)(127 + 16) << 23)), infnan,
        select_u32(mask_if(a < ((uint32_t)(127 - 14) << 23)), sub, normal));
    return (uint16_t)(r | sign);
}

/* bfloat16 is the top half of a binary32, so widening is a shift. */
static inline float bf16_decode(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/* Round the low 16 bits away to nearest even; a carry may ripple into the
 * exponent, up to infinity, which is the right result. A NaN must not go
 * through the rounding (a payload in the low half only would round to
 * infinity), so it is truncated and made quiet instead. */
static inline uint16_t bf16_encode(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)select_u32(mask_if((u & 0x7fffffffu) > 0x7f800000u), nan,
                                rounded);
}

uint16_t weft__float_to_half(float f) { return half_encode(f); }
float weft__half_to_float(uint16_t h) { return half_decode(h); }
uint16_t weft__float_to_bf16(float f) { return bf16_encode(f); }
float weft__bf16_to_float(uint16_t h) { return bf16_decode(h); }

size_t weft_dtype_size(weft_dtype dtype)
{
    switch (dtype) {
    case WEFT_INT8:
    case WEFT_UINT8:
        return 1;
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16:
        return 2;
    case WEFT_INT32:
    case WEFT_UINT32:
    case WEFT_FLOAT32:
        return 4;
    case WEFT_INT64:
    case WEFT_UINT64:
    case WEFT_FLOAT64:
        return 8;
    }
    return 0;
}

int weft__dtype_valid(int dtype)
{
    return dtype >= (int)WEFT_INT8 && dtype <= (int)WEFT_FLOAT64;
}

int weft__op_valid(int op)
{
    return op >= (int)WEFT_SUM && op <= (int)WEFT_MAX;
}

/*
 * Element operations, named <type>_<op>. Integer SUM and PROD are done in
 * an unsigned type at least as wide as unsigned int, where wrapping is
 * defined (signed overflow is undefined, and narrow unsigned types would be
 * promoted to signed int); converting back to a signed type wraps, as GCC
 * and Clang define it.
 */
#define DEFINE_INT_OPS(tag, T, U)                                              \
    static inline T tag##_sum(T x, T y) { return (T)((U)x + (U)y); }           \
    static inline T tag##_prod(T x, T y) { return (T)((U)x * (U)y); }          \
    static inline T tag##_min(T x, T y) { return y < x ? y : x; }              \
    static inline T tag##_max(T x, T y) { return y > x ? y : x; }

DEFINE_INT_OPS(i8, int8_t, unsigned int)
DEFINE_INT_OPS(u8, uint8_t, unsigned int)
DEFINE_INT_OPS(i32, int32_t, unsigned int)
DEFINE_INT_OPS(u32, uint32_t, unsigned int)
DEFINE_INT_OPS(i64, int64_t, uint64_t)
DEFINE_INT_OPS(u64, uint64_t, uint64_t)

/* Float MIN/MAX evaluate every comparison unconditionally: `<` raises
 * FE_INVALID on a NaN, so the compiler will not speculate it out of a
 * short-circuit chain, and a chain it cannot if-convert is not vectorised.
 * The ordered select is a single MINPS/MAXPS (x wins ties and unordered
 * pairs); the NaN selects after it propagate a NaN, x's last so that it
 * wins over y's. */
#define DEFINE_FLOAT_OPS(tag, T)                                               \
    static inline T tag##_sum(T x, T y) { return x + y; }                      \
    static inline T tag##_prod(T x, T y) { return x * y; }                     \
    static inline T tag##_min(T x, T y)                                        \
    {                                                                          \
        T r = y < x ? y : x;                                                   \
        r = isnan(y) ? y : r;                                                  \
        return isnan(x) ? x : r;                                               \
    }                                                                          \
    static inline T tag##_max(T x, T y)                                        \
    {                                                                          \
        T r = y > x ? y : x;                                                   \
        r = isnan(y) ? y : r;                                                  \
        return isnan(x) ? x : r;                                               \
    }

DEFINE_FLOAT_OPS(f32, float)
DEFINE_FLOAT_OPS(f64, double)

/* 16-bit floats: widen both, operate in float32, round once. */
#define DEFINE_NARROW_OPS(tag, decode, encode)                                 \
    static inline uint16_t tag##_sum(uint16_t x, uint16_t y)                   \
    {                                                                          \
        return encode(f32_sum(decode(x), decode(y)));                          \
    }                                                                          \
    static inline uint16_t tag##_prod(uint16_t x, uint16_t y)                  \
    {                                                                          \
        return encode(f32_prod(decode(x), decode(y)));                         \
    }                                                                          \
    static inline uint16_t tag##_min(uint16_t x, uint16_t y)                   \
    {                                                                          \
        return encode(f32_min(decode(x), decode(y)));                          \
    }                                                                          \
    static inline uint16_t tag##_max(uint16_t x, uint16_t y)                   \
    {                                                                          \
        return encode(f32_max(decode(x), decode(y)));                          \
    }

DEFINE_NARROW_OPS(f16, half_decode, half_encode)
DEFINE_NARROW_OPS(bf16, bf16_decode, bf16_encode)

/*
 * kernel_<fn>(dst, a, b, count): dst[i] = fn(a[i], b[i]). dst may equal a
 * (the ivdep pragma says so); b is restrict because it never overlaps dst.
 * The void pointers keep the signature uniform for the dispatch table.
 * Whole blocks go through an inner loop of constant trip count, which the
 * -O2 cost model accepts; the rest, fewer than KERNEL_BLOCK elements, goes
 * through the tail loop.
 */
#define DEFINE_KERNEL(T, fn)                                                   \
    static void kernel_##fn(void *dst_, const void *a_,                        \
                            const void *restrict b_, size_t count)             \
    {                                                                          \
        T *dst = dst_;                                                         \
        const T *a = a_;                                                       \
        const T *restrict b = b_;                                              \
        size_t i = 0;                                                          \
        for (; count - i >= KERNEL_BLOCK; i += KERNEL_BLOCK) {                 \
            KERNEL_IVDEP                                                       \
            for (size_t j = 0; j < KERNEL_BLOCK; j++)                          \
                dst[i + j] = fn(a[i + j], b[i + j]);                           \
        }                                                                      \
        KERNEL_IVDEP                                                           \
        for (; i < count; i++)                                                 \
            dst[i] = fn(a[i], b[i]);                                           \
    }

/* One kernel per line: the compiler reports each vectorised loop at the
 * line of its DEFINE_KERNEL, which is how scripts/check-vectorized tells
 * the kernels apart. Keep it that way (clang-format off). */
/* clang-format off */
DEFINE_KERNEL(int8_t, i8_sum)
DEFINE_KERNEL(int8_t, i8_prod)
DEFINE_KERNEL(int8_t, i8_min)
DEFINE_KERNEL(int8_t, i8_max)
DEFINE_KERNEL(uint8_t, u8_sum)
DEFINE_KERNEL(uint8_t, u8_prod)
DEFINE_KERNEL(uint8_t, u8_min)
DEFINE_KERNEL(uint8_t, u8_max)
DEFINE_KERNEL(int32_t, i32_sum)
DEFINE_KERNEL(int32_t, i32_prod)
DEFINE_KERNEL(int32_t, i32_min)
DEFINE_KERNEL(int32_t, i32_max)
DEFINE_KERNEL(uint32_t, u32_sum)
DEFINE_KERNEL(uint32_t, u32_prod)
DEFINE_KERNEL(uint32_t, u32_min)
DEFINE_KERNEL(uint32_t, u32_max)
DEFINE_KERNEL(int64_t, i64_sum)
DEFINE_KERNEL(int64_t, i64_prod)
DEFINE_KERNEL(int64_t, i64_min)
DEFINE_KERNEL(int64_t, i64_max)
DEFINE_KERNEL(uint64_t, u64_sum)
DEFINE_KERNEL(uint64_t, u64_prod)
DEFINE_KERNEL(uint64_t, u64_min)
DEFINE_KERNEL(uint64_t, u64_max)
DEFINE_KERNEL(uint16_t, f16_sum)
DEFINE_KERNEL(uint16_t, f16_prod)
DEFINE_KERNEL(uint16_t, f16_min)
DEFINE_KERNEL(uint16_t, f16_max)
DEFINE_KERNEL(uint16_t, bf16_sum)
DEFINE_KERNEL(uint16_t, bf16_prod)
DEFINE_KERNEL(uint16_t, bf16_min)
DEFINE_KERNEL(uint16_t, bf16_max)
DEFINE_KERNEL(float, f32_sum)
DEFINE_KERNEL(float, f32_prod)
DEFINE_KERNEL(float, f32_min)
DEFINE_KERNEL(float, f32_max)
DEFINE_KERNEL(double, f64_sum)
DEFINE_KERNEL(double, f64_prod)
DEFINE_KERNEL(double, f64_min)
DEFINE_KERNEL(double, f64_max)
/* clang-format on */

typedef void (*kernel_fn)(void *, const void *, const void *, size_t);

#define KERNEL_ROW(tag)                                                        \
    {                                                                          \
        [WEFT_SUM] = kernel_##tag##_sum, [WEFT_PROD] = kernel_##tag##_prod,    \
        [WEFT_MIN] = kernel_##tag##_min, [WEFT_MAX] = kernel_##tag##_max,      \
    }

static const kernel_fn kernels[WEFT_FLOAT64 + 1][WEFT_MAX + 1] = {
    [WEFT_INT8] = KERNEL_ROW(i8),     [WEFT_UINT8] = KERNEL_ROW(u8),
    [WEFT_INT32] = KERNEL_ROW(i32),   [WEFT_UINT32] = KERNEL_ROW(u32),
    [WEFT_INT64] = KERNEL_ROW(i64),   [WEFT_UINT64] = KERNEL_ROW(u64),
    [WEFT_FLOAT16] = KERNEL_ROW(f16), [WEFT_BFLOAT16] = KERNEL_ROW(bf16),
    [WEFT_FLOAT32] = KERNEL_ROW(f32), [WEFT_FLOAT64] = KERNEL_ROW(f64),
};

void weft__reduce3(void *dst, const void *a, const void *b, size_t count,
                   weft_dtype dtype, weft_redop op)
{
    if (count == 0 || !weft__dtype_valid((int)dtype) ||
        !weft__op_valid((int)op))
        return;
    kernels[dtype][op](dst, a, b, count);
}

void weft__reduce(void *dst, const void *src, size_t count, weft_dtype dtype,
                  weft_redop op)
{
    weft__reduce3(dst, dst, src, count, dtype, op);
}

void weft__reduce_ranks(void *dst, const void *all, int n, size_t count,
                        weft_dtype dtype, weft_redop op)
{
    static const size_t esize[] = {
        [WEFT_INT8] = 1,    [WEFT_UINT8] = 1,    [WEFT_INT32] = 4,
        [WEFT_UINT32] = 4,  [WEFT_INT64] = 8,    [WEFT_UINT64] = 8,
        [WEFT_FLOAT16] = 2, [WEFT_BFLOAT16] = 2, [WEFT_FLOAT32] = 4,
        [WEFT_FLOAT64] = 8,
    };
    const char *in = all;
    size_t bytes;

    if (!weft__dtype_valid((int)dtype))
        return;
    bytes = count * esize[dtype];

    weft__reduce3(dst, in, in + bytes, count, dtype, op);
    for (int i = 2; i < n; i++)
        weft__reduce(dst, in + (size_t)i * bytes, count, dtype, op);
}
