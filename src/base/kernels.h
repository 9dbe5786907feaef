/*
 * Element kernels: the 16-bit float conversions and the reductions that the
 * collectives apply to every received frame.
 *
 * Everything here is a pure function of its arguments: no allocation, no
 * locking, no error reporting, safe to call from any thread. Results do not
 * depend on alignment or on how a buffer is cut into calls, so every rank
 * that reduces the same inputs gets bitwise identical output. The kernels
 * assume the default floating-point environment (round to nearest even);
 * flush-to-zero or denormals-are-zero modes set by the application would
 * change float32 and float64 results just as they change the application's
 * own arithmetic.
 */
#ifndef WEFT_KERNELS_H
#define WEFT_KERNELS_H

#include "weft.h"

#include <stddef.h>
#include <stdint.h>

/* IEEE 754 binary16 <-> binary32. Narrowing rounds to nearest, ties to
 * even, gives correctly rounded subnormals and overflows to infinity. A NaN
 * stays a NaN: narrowing keeps the sign and the top 10 payload bits and sets
 * the quiet bit (as x86 F16C does); widening is exact, payload included. */
uint16_t weft__float_to_half(float f);
float weft__half_to_float(uint16_t h);

/* bfloat16 (the top half of a binary32) <-> binary32. Narrowing rounds to
 * nearest, ties to even, and overflows to infinity; a NaN keeps its sign and
 * top payload bits and comes out quiet. Widening is exact. */
uint16_t weft__float_to_bf16(float f);
float weft__bf16_to_float(uint16_t h);

/* 1 if dtype is one of the weft_dtype values (op: one of weft_redop), else
 * 0. Callers check arguments at the API boundary with these before calling
 * the reductions, which trust their arguments. */
int weft__dtype_valid(int dtype);
int weft__op_valid(int op);

/*
 * Reductions, element by element (so no result depends on how a buffer is
 * split into calls):
 *  - integers wrap around modulo 2^bits (SUM, PROD), signed ones included;
 *  - float32/float64 SUM and PROD are plain IEEE operations;
 *  - MIN/MAX return a NaN operand if there is one (the first operand when
 *    both are NaN); otherwise MIN returns the second operand only if it is
 *    strictly less than the first, MAX only if it is strictly greater, so
 *    of two equal values (-0 and +0 included) the first operand wins;
 *  - float16/bfloat16 operands are widened to float32, combined as above
 *    and rounded back once, to nearest even (so a NaN that MIN/MAX returns
 *    comes back quiet).
 * dtype and op must be valid (see above); with an invalid one nothing is
 * written. count == 0 is a no-op and the pointers may then be NULL.
 */

/* dst[i] = dst[i] OP src[i] for i < count. src must not overlap dst. */
void weft__reduce(void *dst, const void *src, size_t count, weft_dtype dtype,
                  weft_redop op);

/* dst[i] = a[i] OP b[i] for i < count. dst may be a itself but must not
 * otherwise overlap a; b must not overlap dst (a and b may overlap). */
void weft__reduce3(void *dst, const void *a, const void *b, size_t count,
                   weft_dtype dtype, weft_redop op);

/* dst = in[0] OP in[1] OP ... OP in[n-1], left to right, where in[i] is
 * the i-th block of count elements at all (n >= 2): the same order on every
 * rank, so the same bits. dst does not overlap all. */
void weft__reduce_ranks(void *dst, const void *all, int n, size_t count,
                        weft_dtype dtype, weft_redop op);

#endif /* WEFT_KERNELS_H */
