/*
 * Rank output: every line a rank writes to its stdout or stderr is copied
 * to weftrun's own stdout or stderr, prefixed with "[rank N] ".
 *
 * Lines are only ever written whole, so the lines of different ranks never
 * mix, and lines are gathered in one buffer and written in few calls, so a
 * chatty job costs few system calls. A rank that writes no newline has its
 * line cut at WEFTRUN_LINE_MAX, and a process a rank leaves behind holding
 * its pipes is given WEFTRUN_DRAIN_MS after the last rank exits: neither
 * can make weftrun grow without bound or wait forever. A stdout nobody
 * reads any more stops the job, as SIGPIPE would stop a single program.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* After the last rank has exited, how long its output pipes may stay open.
 * They stay open only when a rank left a background process behind that
 * still holds them; weftrun then copies what is already buffered and closes
 * them rather than wait for that process. */
#define WEFTRUN_DRAIN_MS 1000
/* At most this much is read from one pipe when it is closed that way, so a
 * leftover process that keeps writing cannot keep weftrun busy. */
#define WEFTRUN_DRAIN_MAX_BYTES (1 << 20)

/* A line longer than this without a newline is cut and printed in pieces,
 * so a rank that never writes a newline cannot grow weftrun without bound. */
#define WEFTRUN_LINE_MAX 65536
#define WEFTRUN_READ_SIZE 65536

static char out_read_buf[WEFTRUN_READ_SIZE];

/* Writes all of p to fd. Blocks (as any program does) while the reader of
 * weftrun's output does not keep up. */
static void out_write(struct job *job, int fd, const char *p, size_t n)
{
    while (n > 0 && !job->out_failed[fd]) {
        ssize_t w = write(fd, p, n);

        if (w >= 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            (void)poll(&pfd, 1, -1);
            continue;
        }
        job->out_failed[fd] = 1;
        if (errno == EPIPE) {
            /* Whoever read weftrun's output is gone: stop the job, as a
             * single program writing there would be stopped by SIGPIPE. */
            if (fd == 1)
                msg("stdout was closed; stopping the ranks");
            stop_set_exit(job, 128 + SIGPIPE);
            stop_ranks(job, SIGTERM);
        } else if (fd == 1) {
            msg("cannot write to stdout (%s); rank output to stdout is lost",
                strerror(errno));
        }
    }
}

static void out_flush(struct job *job)
{
    if (job->outlen > 0)
        out_write(job, job->outfd, job->outbuf, job->outlen);
    job->outlen = 0;
}

/* Queues one output line: the rank prefix, a, b and a newline if nl. Lines
 * are only ever written whole, so lines of different ranks cannot mix. */
static void out_line(struct job *job, struct stream *s, const char *a,
                     size_t alen, const char *b, size_t blen, int nl)
{
    struct rank *r = s->rank;
    size_t total = r->prefix_len + alen + blen + (nl ? 1 : 0);

    if (job->outfd != s->fd) {
        out_flush(job);
        job->outfd = s->fd;
    }
    if (job->outlen + total > sizeof(job->outbuf))
        out_flush(job);
    if (total > sizeof(job->outbuf)) {
        /* Too long to queue: write its pieces one after the other. Nothing
         * else runs in between, so the line stays whole. */
        out_write(job, s->fd, r->prefix, r->prefix_len);
        out_write(job, s->fd, a, alen);
        out_write(job, s->fd, b, blen);
        if (nl)
            out_write(job, s->fd, "\n", 1);
        return;
    }
    memcpy(job->outbuf + job->outlen, r->prefix, r->prefix_len);
    job->outlen += r->prefix_len;
    if (alen > 0)
        memcpy(job->outbuf + job->outlen, a, alen);
    job->outlen += alen;
    if (blen > 0)
        memcpy(job->outbuf + job->outlen, b, blen);
    job->outlen += blen;
    if (nl)
        job->outbuf[job->outlen++] = '\n';
}

/* Keeps data (no newline in it) as the start of the next line. */
static void out_stream_keep(struct job *job, struct stream *s, const char *data,
                            size_t n)
{
    while (n > 0) {
        size_t take;

        if (s->len == s->cap && s->cap < WEFTRUN_LINE_MAX) {
            size_t cap = s->cap == 0 ? 256 : s->cap * 2;
            char *p;

            if (cap > WEFTRUN_LINE_MAX)
                cap = WEFTRUN_LINE_MAX;
            p = realloc(s->line, cap);
            if (p != NULL) {
                s->line = p;
                s->cap = cap;
            }
        }
        if (s->len == s->cap) {
            /* At the length limit (or out of memory): print what we have
             * as a line of its own, with the new data. */
            out_line(job, s, s->line, s->len, data, n, 1);
            s->len = 0;
            return;
        }
        take = s->cap - s->len;
        if (take > n)
            take = n;
        memcpy(s->line + s->len, data, take);
        s->len += take;
        data += take;
        n -= take;
    }
}

static void out_stream_feed(struct stream *s, const char *data, size_t n)
{
    struct job *job = s->rank->job;

    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t seg;

        if (nl == NULL) {
            out_stream_keep(job, s, data, n);
            break;
        }
        seg = (size_t)(nl - data);
        out_line(job, s, s->line, s->len, data, seg, 1);
        s->len = 0;
        data += seg + 1;
        n -= seg + 1;
    }
    out_flush(job);
}

/* Prints the partial last line, if any, and stops reading. */
static void out_stream_finish(struct stream *s)
{
    struct job *job = s->rank->job;

    if (!s->open)
        return;
    if (s->len > 0) {
        out_line(job, s, s->line, s->len, NULL, 0, 1);
        out_flush(job);
    }
    free(s->line);
    s->line = NULL;
    s->len = s->cap = 0;
    s->open = 0;
    uv_close((uv_handle_t *)&s->pipe, NULL);
    job->nopen--;
}

/* Copies what is already buffered in the pipe, without waiting for more,
 * then closes it. */
static void out_stream_drain_now(struct stream *s)
{
    uv_os_fd_t fd;
    size_t total = 0;

    if (!s->open)
        return;
    if (uv_fileno((uv_handle_t *)&s->pipe, &fd) == 0) {
        while (total < WEFTRUN_DRAIN_MAX_BYTES) {
            ssize_t n = read(fd, out_read_buf, sizeof(out_read_buf));

            if (n > 0) {
                out_stream_feed(s, out_read_buf, (size_t)n);
                total += (size_t)n;
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                break; /* EOF, EAGAIN (the pipe is non-blocking) or error */
            }
        }
    }
    out_stream_finish(s);
}

void out_drain_all(struct job *job)
{
    for (int i = 0; i < job->opts->nranks; i++)
        for (int k = 0; k < 2; k++)
            out_stream_drain_now(&job->ranks[i].streams[k]);
}

static void out_drain_timer_cb(uv_timer_t *t)
{
    out_drain_all(t->data);
}

/* Once every rank has exited, the job ends when the pipes reach EOF; the
 * drain timer makes sure it ends even if some process still holds them. */
void out_check_done(struct job *job)
{
    if (job->spawning || job->nrunning > 0 || job->nopen == 0)
        return;
    if (!uv_is_active((uv_handle_t *)&job->drain_timer))
        uv_timer_start(&job->drain_timer, out_drain_timer_cb, WEFTRUN_DRAIN_MS,
                       0);
}

static void out_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    /* One buffer serves every pipe: out_read_cb consumes it before the next
     * read. */
    *buf = uv_buf_init(out_read_buf, sizeof(out_read_buf));
}

static void out_read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct stream *s = stream->data;

    if (nread > 0)
        out_stream_feed(s, buf->base, (size_t)nread);
    else if (nread < 0) /* UV_EOF, or an error, which ends it just the same */
        out_stream_finish(s);
}

int out_stream_start(struct stream *s)
{
    int rc = uv_read_start((uv_stream_t *)&s->pipe, out_alloc_cb, out_read_cb);

    if (rc != 0) {
        msg("cannot read the output of rank %d: %s", s->rank->index,
            uv_strerror(rc));
        return -1;
    }
    s->open = 1;
    s->rank->job->nopen++;
    return 0;
}
