/*
 * The helpers every file of the hostfile shares (hostfile_int.h): failure
 * messages, strings, hosts, ports and links. They call nothing in the
 * hostfile's other files, which all sit above this one.
 */
#include "topo/hostfile_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int weft__hf_fail(hf_ctx *c, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (c->errmsg == NULL || c->errlen == 0)
        return WEFT_ECONFIG;
    n = snprintf(c->errmsg, c->errlen, "%s: ", c->file);
    if (n < 0 || (size_t)n >= c->errlen)
        return WEFT_ECONFIG;
    va_start(ap, fmt);
    vsnprintf(c->errmsg + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return WEFT_ECONFIG;
}

int weft__hf_nomem(hf_ctx *c)
{
    if (c->errmsg != NULL && c->errlen > 0)
        snprintf(c->errmsg, c->errlen, "%s: out of memory reading the hostfile",
                 c->file);
    return WEFT_ENOMEM;
}

void weft__hf_app(char *buf, size_t len, const char *fmt, ...)
{
    size_t n = strlen(buf);
    va_list ap;

    if (n + 1 >= len)
        return;
    va_start(ap, fmt);
    vsnprintf(buf + n, len - n, fmt, ap);
    va_end(ap);
}

void weft__hf_copy_str(char *dst, size_t dstlen, const char *src)
{
    size_t n = strlen(src);
    if (n >= dstlen)
        n = dstlen - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

int weft__hf_find_host(const weft__hostfile_out *h, int upto, const char *name)
{
    for (int i = 0; i < upto; i++)
        if (strcmp(h->hosts[i].name, name) == 0)
            return i;
    return -1;
}

int weft__hf_default_ports(weft__host *host, int base)
{
    for (int k = 0; k < host->nranks; k++) {
        if (base + k > 65535)
            return -1;
        host->ports[k] = base + k;
    }
    return 0;
}

void weft__hf_set_link(weft__link *l, int h0, const char *a0, int h1,
                       const char *a1)
{
    l->end[0].host = h0;
    weft__hf_copy_str(l->end[0].addr, sizeof l->end[0].addr, a0);
    l->end[1].host = h1;
    weft__hf_copy_str(l->end[1].addr, sizeof l->end[1].addr, a1);
}
