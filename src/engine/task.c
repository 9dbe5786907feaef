/* Tasks; see task.h. */
#include "engine/task.h"

#include <stdlib.h>
#include <string.h>

void weft__task_init(weft__task *t, weft__ctx *c, weft__call *k,
                     const weft__args *a)
{
    memset(t, 0, sizeof *t);
    t->c = c;
    t->k = k;
    t->a = *a;
    t->g = (weft__group){c->nranks, c->rank, 0, 1};
}

int weft__task_pass(weft__task *t, weft__op *op, const weft__relay *relay)
{
    op->group = t->g;
    return weft__pass_start(t->c, t->k, op, relay, &t->pass);
}

int weft__task_sub(weft__task *t, const weft__args *a, weft__task_fn post)
{
    return weft__task_sub_in(t, &t->g, a, post);
}

int weft__task_sub_in(weft__task *t, const weft__group *g, const weft__args *a,
                      weft__task_fn post)
{
    weft__task *s = malloc(sizeof *s);
    int rc;

    if (s == NULL)
        return weft__set_error(t->c, WEFT_ENOMEM, "rank %d: %s: out of memory",
                               t->c->rank, t->k->name);
    weft__task_init(s, t->c, t->k, a);
    s->g = *g;
    if ((rc = post(s)) != WEFT_OK) {
        free(s);
        return rc;
    }
    t->sub = s;
    return WEFT_OK;
}

int weft__task_progress(weft__task *t)
{
    for (;;) {
        weft__task_fn next;
        int rc = WEFT_OK;

        if (t->sub != NULL) {
            if ((rc = weft__task_progress(t->sub)) == WEFT__PENDING)
                return rc;
            free(t->sub);
            t->sub = NULL;
        } else if (t->pass != NULL) {
            if ((rc = weft__pass_test(t->pass)) == WEFT__PENDING)
                return rc;
            weft__pass_end(t->pass, rc);
            t->pass = NULL;
        }
        if (rc != WEFT_OK || t->next == NULL)
            return rc;
        next = t->next;
        t->next = NULL;
        if ((rc = next(t)) != WEFT_OK)
            return rc;
    }
}

weft__pass *weft__task_pass_of(const weft__task *t)
{
    while (t->sub != NULL)
        t = t->sub;
    return t->pass;
}

void weft__task_end(weft__task *t, int rc)
{
    if (t->sub != NULL) {
        weft__task_end(t->sub, rc);
        free(t->sub);
        t->sub = NULL;
    }
    if (t->pass != NULL) {
        weft__pass_end(t->pass, rc == WEFT_OK ? WEFT_EABORTED : rc);
        t->pass = NULL;
    }
    free(t->owned);
    t->owned = NULL;
}

int weft__task_wait(weft__task *t)
{
    int rc;

    /* Only the innermost task has a pass in flight. */
    while ((rc = weft__task_progress(t)) == WEFT__PENDING)
        weft__pass_wait(weft__task_pass_of(t));
    return rc;
}
