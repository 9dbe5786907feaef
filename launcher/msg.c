/*
 * weftrun's own messages (weftrun.h says how they are written). Every
 * other file of weftrun reports through msg(), so it sits below them all
 * and calls none of them.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void msg(const char *fmt, ...)
{
    char buf[1024];
    size_t n;
    va_list ap;
    int len;

    memcpy(buf, "weftrun: ", 9);
    va_start(ap, fmt);
    len = vsnprintf(buf + 9, sizeof(buf) - 10, fmt, ap);
    va_end(ap);
    n = 9 + (len < 0 ? 0 : (size_t)len);
    if (n > sizeof(buf) - 2)
        n = sizeof(buf) - 2; /* truncated */
    buf[n++] = '\n';
    fwrite(buf, 1, n, stderr);
}
