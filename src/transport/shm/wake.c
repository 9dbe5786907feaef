/*
 * Failures and wake-ups of the shared-memory transport: the first failure
 * recorded, and the peers of this host that sleep woken. The data path
 * (data.c) and the box (box.c) both use these; nothing here calls them.
 */
#include "transport/shm/shm.h"

void weft__shm_fail(shm_tp *tp, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    weft__tp_fail(tp->p->sink, &tp->err, err, fmt, ap);
    va_end(ap);
}

void weft__shm_poke_sleepers(shm_tp *tp)
{
    shm_full_fence();
    for (int i = 0; i < tp->nlocal; i++)
        if (tp->wires[i].seg != NULL)
            shm_wake_sleeper(&tp->wires[i]);
}
