/*
 * weft_listener: a listening socket bound before the job's addresses are
 * known, so a framework can publish "addr:port" in its own store and hand
 * the socket to weft_init_config, which listens on it. Peers that connect
 * before then wait in its backlog.
 */
#include "core/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct weft_listener {
    int fd;
};

#define LISTEN_BACKLOG 128

/* weft_last_error(NULL) says why; returns rc. */
__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt,
                                                      ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(weft__init_errmsg, sizeof weft__init_errmsg, fmt, ap);
    va_end(ap);
    return rc;
}

int weft_listener_open(weft_listener **out, const char *host, char *addr,
                       size_t addrlen)
{
    struct addrinfo hints, *res = NULL;
    struct sockaddr_in sa;
    socklen_t salen = sizeof sa;
    char ip[INET_ADDRSTRLEN], text[INET_ADDRSTRLEN + 8];
    weft_listener *l;
    int fd, gai;

    weft__init_errmsg[0] = '\0';
    if (out != NULL)
        *out = NULL;
    if (out == NULL || addr == NULL)
        return fail(WEFT_EINVAL, "weft_listener_open: %s is NULL",
                    out == NULL ? "out" : "addr");
    if (host == NULL)
        host = "127.0.0.1";
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET; /* weft's wires are IPv4 */
    hints.ai_socktype = SOCK_STREAM;
    if ((gai = getaddrinfo(host, NULL, &hints, &res)) != 0)
        return fail(WEFT_ECONFIG,
                    "weft_listener_open: host \"%s\" has no IPv4 address: %s",
                    host, gai_strerror(gai));
    memcpy(&sa, res->ai_addr, sizeof sa);
    freeaddrinfo(res);
    sa.sin_port = 0; /* the system picks a free port */
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(fd, LISTEN_BACKLOG) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &salen) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return fail(WEFT_ETRANSPORT,
                    "weft_listener_open: cannot listen on %s: %s", host,
                    strerror(e));
    }
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(text, sizeof text, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
    if (strlen(text) >= addrlen) {
        close(fd);
        return fail(WEFT_EINVAL,
                    "weft_listener_open: addrlen %zu is too short for \"%s\" "
                    "(22 bytes always suffice)",
                    addrlen, text);
    }
    if ((l = malloc(sizeof *l)) == NULL) {
        close(fd);
        return fail(WEFT_ENOMEM, "weft_listener_open: out of memory");
    }
    l->fd = fd;
    strcpy(addr, text);
    *out = l;
    return WEFT_OK;
}

int weft_listener_close(weft_listener *l)
{
    int fd = weft__listener_take(l);

    if (fd >= 0)
        close(fd);
    return WEFT_OK;
}

int weft__listener_take(weft_listener *l)
{
    int fd;

    if (l == NULL)
        return -1;
    fd = l->fd;
    free(l);
    return fd;
}

int weft__fd_port(int fd)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;

    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0 ||
        sa.sin_family != AF_INET)
        return -1;
    return ntohs(sa.sin_port);
}
