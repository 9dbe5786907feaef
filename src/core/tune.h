/*
 * The tuning table (tune.c): which algorithm runs each collective, by the
 * operation and its size, on one communicator. Rows of operation, size
 * range and algorithm, computed when the communicator is made from what
 * the job is (ranks, ranks per host, transport, cores per rank, the
 * topology in effect); WEFT_ALGO replaces an operation's rows. The first
 * row whose range holds the call's size and whose algorithm can run the
 * call wins; past every row, the topology's own algorithm (the mesh's or
 * the ring's) runs. Every rank of a job builds the same table, so ranks
 * always run the same algorithm.
 */
#ifndef WEFT_TUNE_H
#define WEFT_TUNE_H

#include "coll/coll.h"

/* The algorithms, by the names WEFT_ALGO and weft_info use. */
enum {
    WEFT__ALGO_BOX = 1,  /* shared memory's box (one host, small) */
    WEFT__ALGO_HIER,     /* within the hosts, across them, within them */
    WEFT__ALGO_PULL,     /* one-copy reads of every rank's memory */
    WEFT__ALGO_GATHER,   /* every input to every rank, reduced in rank order */
    WEFT__ALGO_DOUBLING, /* recursive doubling */
    WEFT__ALGO_HALVING,  /* recursive halving + doubling */
    WEFT__ALGO_MESH,     /* direct exchanges with every peer */
    WEFT__ALGO_RING,     /* around the ring */
    WEFT__ALGO_COUNT
};

/* The topology classes a table is built for. */
enum {
    WEFT__ON_RING = 1, /* some pair of ranks has no direct wires, or the
                          topology asked for is "ring" */
    WEFT__ON_DIRECT,   /* every pair is wired, the mesh not in effect (the
                          ranks of one host, topology "auto") */
    WEFT__ON_MESH,     /* the mesh is in effect and every pair is wired */
};

/* One row: from lo up to and including hi bytes (count * element size:
 * the buffer of each rank, a rank's block for all_gather and
 * reduce_scatter), operation op runs algorithm algo. Rows are tried in
 * order, so of "0-2k=box,2k-8m=halving" 2 KiB takes the box. */
typedef struct weft__tune_row {
    int op; /* WEFT__OP_* */
    size_t lo, hi;
    int algo;
} weft__tune_row;

#define WEFT__TUNE_MAX_ROWS 64

typedef struct weft__tune {
    int on; /* WEFT__ON_* */
    int nrows;
    weft__tune_row rows[WEFT__TUNE_MAX_ROWS];
    /* Operations whose rows WEFT_ALGO gave (bit per WEFT__OP_*). */
    unsigned set;
} weft__tune;

/* What a table's algorithms need of the communicator beyond its
 * configuration: the topology class, the box's bytes per rank (0: none),
 * whether the one-copy reads reach every rank. */
typedef struct weft__tune_env {
    int on;
    size_t box;
    int pull;
    int any; /* 1: take any algorithm (a job of one rank runs none) */
} weft__tune_env;

/* The topology class of c (WEFT__ON_*), once its transport is up. */
int weft__topology(const weft__ctx *c);

/* 1 when every pair of ranks has direct wires, the job has at most
 * WEFT__MESH_MAX_RANKS ranks (one engine lane per peer) and the topology
 * asked for is not "ring". */
int weft__direct_ok(const weft__ctx *c);

/* Builds cfg's table for env, then applies the override `algo` (the text
 * of WEFT_ALGO, or NULL). WEFT_ECONFIG with errmsg saying what is wrong
 * where the override does not parse, names an operation or algorithm
 * that does not exist, or asks for one that cannot run here. */
int weft__tune_build(weft__tune *t, const weft__config *cfg,
                     const weft__tune_env *env, const char *algo, char *errmsg,
                     size_t errlen);

/* The table of c (tune_build with c's configuration, its topology class,
 * box and reads, and WEFT_ALGO), as weft_init makes it. A job of one rank
 * runs no algorithm: its WEFT_ALGO must parse, nothing more. */
int weft__tune_init(weft__tune *t, const weft__ctx *c, char *errmsg,
                    size_t errlen);
/* The same with algo (NULL or "": the defaults) in place of WEFT_ALGO. */
int weft__tune_init_from(weft__tune *t, const weft__ctx *c, const char *algo,
                         char *errmsg, size_t errlen);

/* The algorithm that runs operation `kind` (WEFT__OP_*) with arguments a
 * on c under table t, and whether consecutive calls of it may run as one
 * batch (*batch; see core/sched.c): fn's passes hear from every rank,
 * so the call's hint (engine.h) ends agreed, and it reduces each element
 * in an order that does not depend on where the element lies or how many
 * there are. Never NULL for the collective kinds. */
weft__algo_fn weft__tune_pick(const weft__tune *t, const weft__ctx *c, int kind,
                              const weft__args *a, int *batch);

/* Writes t as text (one line per operation: "all_reduce:0-2k=box,...")
 * into out; returns the length it needed. */
size_t weft__tune_print(const weft__tune *t, char *out, size_t len);

/* The name of algorithm a, or "?". */
const char *weft__algo_name(int a);

#endif
