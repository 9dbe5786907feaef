/*
 * Fixed-width integers in byte buffers, one way for every wire format:
 * network (big-endian) order for the TCP handshakes and relay headers,
 * little-endian for the engine's operation headers.
 */
#ifndef WEFT_BYTES_H
#define WEFT_BYTES_H

#include <stddef.h>
#include <stdint.h>

static inline void weft__put_be32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static inline uint32_t weft__get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           (uint32_t)p[3];
}

static inline void weft__put_be64(uint8_t *p, uint64_t v)
{
    weft__put_be32(p, (uint32_t)(v >> 32));
    weft__put_be32(p + 4, (uint32_t)v);
}

static inline uint64_t weft__get_be64(const uint8_t *p)
{
    return (uint64_t)weft__get_be32(p) << 32 | weft__get_be32(p + 4);
}

static inline void weft__put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t weft__get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline void weft__put_le64(uint8_t *p, uint64_t v)
{
    weft__put_le32(p, (uint32_t)v);
    weft__put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t weft__get_le64(const uint8_t *p)
{
    return (uint64_t)weft__get_le32(p) | (uint64_t)weft__get_le32(p + 4) << 32;
}

/* FNV-1a over len bytes at p, from h (WEFT__FNV_BASIS to start): a hash
 * for comparing and deriving, not for security. */
#define WEFT__FNV_BASIS 0xcbf29ce484222325ull
static inline uint64_t weft__fnv1a(uint64_t h, const void *p, size_t len)
{
    const uint8_t *b = p;

    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#endif
