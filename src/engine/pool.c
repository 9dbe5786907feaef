/* The pool of helper threads; see pool.h.
 *
 * A job's parts are taken with one atomic word, the job's number in its
 * high half and the next part in its low half: a helper that wakes late,
 * after its job ended, finds another number there and takes nothing (the
 * next job may be under way, with other arguments). A job wakes only the
 * helpers it has parts for, and the caller waits for its parts to be done
 * (spinning a little first: a wake-up through the kernel costs more than
 * the last part of a small job), not for every helper to come and go. */
#include "engine/pool.h"

#include "base/base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

/* How long the caller polls for its job's last parts before it sleeps. */
#define POOL_SPIN_NS 50000

typedef struct helper {
    weft__pool *p;
    int id; /* its scratch: p->scratch[id] (0 is the caller's) */
    pthread_t th;
} helper;

struct weft__pool {
    pthread_mutex_t mu;
    pthread_cond_t go;   /* a job was posted, or stop */
    pthread_cond_t done; /* a job's last part is done */
    int nhelpers;
    helper *helpers;
    void **scratch; /* nhelpers + 1 */
    size_t scratch_bytes;
    /* The job, written under mu before it is numbered in take. */
    uint32_t gen;
    int stop;
    weft__pool_fn fn;
    void *arg;
    int nparts;
    _Atomic uint64_t take; /* gen << 32 | the next part */
    atomic_int parts_done; /* of the current job */
};

/* Runs parts of job gen while there are some: 1 where this thread ran
 * the job's last part to end. */
static int run_parts(weft__pool *p, uint32_t gen, weft__pool_fn fn, void *arg,
                     int nparts, void *scratch)
{
    uint64_t v = atomic_load_explicit(&p->take, memory_order_acquire);

    for (;;) {
        if ((uint32_t)(v >> 32) != gen || (uint32_t)v >= (uint32_t)nparts)
            return 0;
        if (!atomic_compare_exchange_weak_explicit(&p->take, &v, v + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(arg, (int)(uint32_t)v, scratch);
        /* Release: the part's writes before the caller's return. */
        if (atomic_fetch_add_explicit(&p->parts_done, 1, memory_order_acq_rel) +
                1 ==
            nparts)
            return 1;
        v = atomic_load_explicit(&p->take, memory_order_acquire);
    }
}

static void *helper_main(void *v)
{
    helper *h = v;
    weft__pool *p = h->p;
    uint32_t seen = 0;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        weft__pool_fn fn;
        void *arg;
        int nparts;

        while (p->gen == seen && !p->stop)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        fn = p->fn;
        arg = p->arg;
        nparts = p->nparts;
        pthread_mutex_unlock(&p->mu);
        if (run_parts(p, seen, fn, arg, nparts, p->scratch[h->id])) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
        } else
            pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

weft__pool *weft__pool_create(int nthreads)
{
    weft__pool *p = calloc(1, sizeof *p);
    int want = nthreads > 1 ? nthreads - 1 : 0;

    if (p == NULL)
        return NULL;
    p->helpers = calloc((size_t)want + 1, sizeof *p->helpers);
    p->scratch = calloc((size_t)want + 1, sizeof *p->scratch);
    if (p->helpers == NULL || p->scratch == NULL) {
        free(p->helpers);
        free(p->scratch);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->take, 0);
    atomic_init(&p->parts_done, 0);
    for (int i = 0; i < want; i++) {
        helper *h = &p->helpers[p->nhelpers];

        h->p = p;
        h->id = p->nhelpers + 1;
        if (pthread_create(&h->th, NULL, helper_main, h) != 0)
            break; /* the jobs run on fewer threads */
        p->nhelpers++;
    }
    return p;
}

void weft__pool_destroy(weft__pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nhelpers; i++)
        pthread_join(p->helpers[i].th, NULL);
    for (int i = 0; i <= p->nhelpers; i++)
        free(p->scratch[i]);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->go);
    pthread_mutex_destroy(&p->mu);
    free(p->scratch);
    free(p->helpers);
    free(p);
}

int weft__pool_threads(const weft__pool *p)
{
    return p->nhelpers + 1;
}

int weft__pool_reserve(weft__pool *p, size_t bytes)
{
    if (bytes <= p->scratch_bytes)
        return 0;
    /* Between jobs no helper touches its buffer (a late one takes no
     * part), so they are the caller's to replace. */
    for (int i = 0; i <= p->nhelpers; i++) {
        void *b = malloc(bytes);

        if (b == NULL)
            return -1;
        free(p->scratch[i]);
        p->scratch[i] = b;
    }
    p->scratch_bytes = bytes;
    return 0;
}

void weft__pool_run(weft__pool *p, int nparts, weft__pool_fn fn, void *arg)
{
    int wake = nparts - 1 < p->nhelpers ? nparts - 1 : p->nhelpers;
    uint32_t gen;
    uint64_t end;

    if (wake <= 0) {
        for (int i = 0; i < nparts; i++)
            fn(arg, i, p->scratch[0]);
        return;
    }
    pthread_mutex_lock(&p->mu);
    gen = ++p->gen;
    p->fn = fn;
    p->arg = arg;
    p->nparts = nparts;
    atomic_store_explicit(&p->parts_done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->take, (uint64_t)gen << 32, memory_order_release);
    for (int i = 0; i < wake; i++)
        pthread_cond_signal(&p->go);
    pthread_mutex_unlock(&p->mu);
    if (run_parts(p, gen, fn, arg, nparts, p->scratch[0]))
        return;
    end = weft__now_ns() + POOL_SPIN_NS;
    while (atomic_load_explicit(&p->parts_done, memory_order_acquire) < nparts)
        if (weft__now_ns() >= end) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->parts_done, memory_order_acquire) <
                   nparts)
                pthread_cond_wait(&p->done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
}
