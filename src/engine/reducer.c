/* The reducer thread; see reducer.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np */
#endif
#include "engine/reducer.h"

#include "base/kernels.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

struct weft__reducer {
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* work queued, stop, or the thread went idle */
    weft__rjob *q_head; /* posted, not started, oldest first */
    weft__rjob *q_tail;
    weft__rjob *d_head; /* finished, not yet taken, oldest first */
    weft__rjob *d_tail;
    atomic_int finished; /* d_head != NULL, read without the lock */
    int busy;            /* a job runs, or its wake() has not returned */
    int stop;
    void (*wake)(void *arg);
    void *arg;
    pthread_t thread;
};

static void *reducer_main(void *p)
{
    weft__reducer *rd = p;

    /* Named for profiles (perf report --sort comm) and debuggers. */
    pthread_setname_np(pthread_self(), "weft-reduce");
    pthread_mutex_lock(&rd->mu);
    for (;;) {
        weft__rjob *j = rd->q_head;

        if (j == NULL) {
            if (rd->stop)
                break;
            pthread_cond_wait(&rd->cv, &rd->mu);
            continue;
        }
        rd->q_head = j->next;
        if (rd->q_head == NULL)
            rd->q_tail = NULL;
        j->next = NULL;
        rd->busy = 1;
        pthread_mutex_unlock(&rd->mu);
        if (j->count > 0)
            weft__reduce3(j->dst, j->a, j->b, j->count, j->dtype, j->op);
        pthread_mutex_lock(&rd->mu);
        /* Finished before the driver hears of it, so that the driver's
         * take() after the wake finds it. A cancel() meanwhile dropped it
         * from the engine's view: then nobody takes it, and nobody is
         * woken. */
        if (rd->busy == 1) {
            if (rd->d_tail != NULL)
                rd->d_tail->next = j;
            else
                rd->d_head = j;
            rd->d_tail = j;
            atomic_store(&rd->finished, 1);
            pthread_mutex_unlock(&rd->mu);
            rd->wake(rd->arg);
            pthread_mutex_lock(&rd->mu);
        }
        rd->busy = 0;
        pthread_cond_broadcast(&rd->cv);
    }
    pthread_mutex_unlock(&rd->mu);
    return NULL;
}

int weft__reducer_create(void (*wake)(void *arg), void *arg,
                         weft__reducer **out)
{
    weft__reducer *rd = calloc(1, sizeof *rd);
    sigset_t all, old;
    int rc;

    *out = NULL;
    if (rd == NULL)
        return WEFT_ENOMEM;
    rd->wake = wake;
    rd->arg = arg;
    atomic_init(&rd->finished, 0);
    if (pthread_mutex_init(&rd->mu, NULL) != 0) {
        free(rd);
        return WEFT_ENOMEM;
    }
    if (pthread_cond_init(&rd->cv, NULL) != 0)
        goto clean_mu;
    /* Signals go to the application's threads, never to ours. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&rd->thread, NULL, reducer_main, rd);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        goto clean_cv;
    *out = rd;
    return WEFT_OK;

clean_cv:
    pthread_cond_destroy(&rd->cv);
clean_mu:
    pthread_mutex_destroy(&rd->mu);
    free(rd);
    return WEFT_ENOMEM;
}

void weft__reducer_destroy(weft__reducer *rd)
{
    if (rd == NULL)
        return;
    pthread_mutex_lock(&rd->mu);
    rd->stop = 1;
    rd->q_head = rd->q_tail = NULL;
    pthread_cond_broadcast(&rd->cv);
    pthread_mutex_unlock(&rd->mu);
    pthread_join(rd->thread, NULL);
    pthread_cond_destroy(&rd->cv);
    pthread_mutex_destroy(&rd->mu);
    free(rd);
}

void weft__reducer_post(weft__reducer *rd, weft__rjob *j)
{
    j->next = NULL;
    pthread_mutex_lock(&rd->mu);
    if (rd->q_tail != NULL)
        rd->q_tail->next = j;
    else {
        rd->q_head = j;
        /* Only an idle thread waits for work. */
        pthread_cond_broadcast(&rd->cv);
    }
    rd->q_tail = j;
    pthread_mutex_unlock(&rd->mu);
}

weft__rjob *weft__reducer_take(weft__reducer *rd)
{
    weft__rjob *j;

    if (rd == NULL || !atomic_load(&rd->finished))
        return NULL;
    pthread_mutex_lock(&rd->mu);
    j = rd->d_head;
    rd->d_head = rd->d_tail = NULL;
    atomic_store(&rd->finished, 0);
    pthread_mutex_unlock(&rd->mu);
    return j;
}

void weft__reducer_cancel(weft__reducer *rd)
{
    if (rd == NULL)
        return;
    pthread_mutex_lock(&rd->mu);
    rd->q_head = rd->q_tail = NULL;
    /* The running job is left to finish, but not to be handed back (see
     * reducer_main): busy 2 marks it forgotten. */
    if (rd->busy == 1)
        rd->busy = 2;
    while (rd->busy != 0)
        pthread_cond_wait(&rd->cv, &rd->mu);
    rd->d_head = rd->d_tail = NULL;
    atomic_store(&rd->finished, 0);
    pthread_mutex_unlock(&rd->mu);
}
