/*
 * The settings weft reads from the environment, declared once (params.c):
 * each one's variable, the field of the configuration it fills, its type,
 * range and default, whether every rank must give it alike, and one line
 * of documentation. The configuration loader (config.c), its range checks,
 * the comparison of the ranks' settings when a communicator is made, and
 * the tables of variables in the README and docs/reference.md all come
 * from this table.
 */
#ifndef WEFT_PARAMS_H
#define WEFT_PARAMS_H

#include "topo/topo.h"

#include <stddef.h>

/* Every setting, in the table's order. */
enum {
    WEFT__P_RANK,
    WEFT__P_SIZE,
    WEFT__P_HOSTFILE,
    WEFT__P_HOSTFILE_TEXT,
    WEFT__P_JOB_TOKEN,
    WEFT__P_TIMEOUT_MS,
    WEFT__P_CONNECT_TIMEOUT_MS,
    WEFT__P_WIRE_TIMEOUT_MS,
    WEFT__P_WIRES,
    WEFT__P_TRANSPORT,
    WEFT__P_TOPOLOGY,
    WEFT__P_ALGO,
    WEFT__P_SHM,
    WEFT__P_LOG,
    WEFT__P_LIBRARY,
    WEFT__P_FRAME_BYTES,
    WEFT__P_SOCKBUF_BYTES,
    WEFT__P_SPIN_US,
    WEFT__P_MIN_WIRE_BYTES,
    WEFT__P_BIDIR_MIN_BYTES,
    WEFT__P_SHM_RING_BYTES,
    WEFT__P_SHM_CMA_BYTES,
    WEFT__P_PULL_THREADS,
    WEFT__P_HIER_PULL_ALL_REDUCE_BYTES,
    WEFT__P_HIER_PULL_ALL_GATHER_BYTES,
    WEFT__P_HIER_PULL_REDUCE_SCATTER_BYTES,
    WEFT__P_REDUCE_THREAD,
    WEFT__P_REDUCE_THREAD_MIN_BYTES,
    WEFT__P_REDUCE_THREAD_PASS_BYTES,
    WEFT__P_SEND_THREAD,
    WEFT__P_SEND_THREAD_MIN_BYTES,
    WEFT__P_SEND_THREAD_PASS_BYTES,
    WEFT__P_IB_DEVICE,
    WEFT__P_IB_SLOTS,
    WEFT__P_IB_SLOT_BYTES,
    WEFT__P_COUNT
};

/* How a setting's value is held. */
enum {
    WEFT__PT_INT = 1, /* an int field of weft__config */
    WEFT__PT_SIZE,    /* a size_t field */
    WEFT__PT_STR,     /* a string (config.c reads it) */
    WEFT__PT_DOC,     /* read elsewhere (launcher, Python, logging) */
};

/* What else is true of it. */
enum {
    WEFT__PF_SAME = 1 << 0, /* every rank of a job gives it alike: compared
                               when the communicator is made */
    WEFT__PF_USER = 1 << 1, /* one a user sets: in the README's table */
    WEFT__PF_AUTO = 1 << 2, /* unset: computed from the job (the doc says
                               how); the default shown is none */
    WEFT__PF_POW2 = 1 << 3, /* a power of two */
};

typedef struct weft__param {
    const char *name;  /* the environment variable */
    int type;          /* WEFT__PT_* */
    size_t off;        /* its field in weft__config (INT, SIZE) */
    long uc_off;       /* its field in weft_config (an int), or -1 */
    long lo, hi, dflt; /* range and default (INT, SIZE) */
    unsigned flags;    /* WEFT__PF_* */
    const char *doc;   /* one line, Markdown */
} weft__param;

extern const weft__param weft__params[WEFT__P_COUNT];

/* The value of numeric setting p in cfg. */
long weft__param_get(const weft__config *cfg, int p);

/* Writes the Markdown table of the settings whose flags include all of
 * `flags` (0: every one) into out; returns the length it needed. */
size_t weft__params_markdown(unsigned flags, char *out, size_t len);

#endif
