/*
 * weft-bench: bandwidth and correctness benchmark for weft, modelled on
 * nccl-tests. Run it under weftrun, one process per rank:
 *
 *   weftrun -n 4 -- weft-bench -o all_reduce -b 8 -e 64M -f 2 -d float -r sum
 *
 * Every rank parses the same arguments, so a bad flag makes every rank print
 * the problem and exit 2 before anything is connected.
 *
 * For each size the benchmark runs the warm-up iterations, then times the
 * measured iterations; each rank takes its own average time per operation and
 * the slowest rank's average is reported. With -c 1 it then re-initialises
 * the buffers, runs the operation once more and compares every element of
 * the result bitwise with the value computed locally. The input patterns are
 * small integers chosen so that every reduction is exact in every dtype
 * (bfloat16 included) whatever the order of the reduction, so the expected
 * result is exact and a bitwise comparison is fair.
 *
 * Bandwidths follow nccl-tests: algbw = size / time, where size is the whole
 * buffer (for all_gather and gather the received buffer, for
 * reduce_scatter and scatter the sent one, for the all-to-alls either,
 * i.e. nranks * count elements; for the others count elements), and
 * busbw = algbw * factor with factor 2(n-1)/n for all_reduce, (n-1)/n for
 * all_gather, reduce_scatter, gather, scatter, all_to_all and all_to_allv
 * (the share of the buffer that crosses a link) and 1 for broadcast,
 * reduce and sendrecv. GB means 1e9 bytes.
 *
 * Exit status: 0 when every check passed, 1 when a check failed or a weft
 * call failed, 2 for bad arguments.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <weft.h>

/* ------------------------------------------------------------------------ */
/* Operations, dtypes and reductions                                         */

enum bench_op {
    OP_ALL_REDUCE,
    OP_ALL_GATHER,
    OP_REDUCE_SCATTER,
    OP_BROADCAST,
    OP_SENDRECV,
    OP_REDUCE,
    OP_GATHER,
    OP_SCATTER,
    OP_ALL_TO_ALL,
    OP_ALL_TO_ALLV
};

static const struct {
    const char *name;
    enum bench_op op;
} op_names[] = {
    {"all_reduce", OP_ALL_REDUCE},
    {"allreduce", OP_ALL_REDUCE},
    {"all_gather", OP_ALL_GATHER},
    {"allgather", OP_ALL_GATHER},
    {"reduce_scatter", OP_REDUCE_SCATTER},
    {"reducescatter", OP_REDUCE_SCATTER},
    {"broadcast", OP_BROADCAST},
    {"bcast", OP_BROADCAST},
    {"sendrecv", OP_SENDRECV},
    {"send_recv", OP_SENDRECV},
    {"reduce", OP_REDUCE},
    {"gather", OP_GATHER},
    {"scatter", OP_SCATTER},
    {"all_to_all", OP_ALL_TO_ALL},
    {"alltoall", OP_ALL_TO_ALL},
    {"all_to_allv", OP_ALL_TO_ALLV},
    {"alltoallv", OP_ALL_TO_ALLV},
};

static const char *op_name(enum bench_op op)
{
    switch (op) {
    case OP_ALL_REDUCE:
        return "all_reduce";
    case OP_ALL_GATHER:
        return "all_gather";
    case OP_REDUCE_SCATTER:
        return "reduce_scatter";
    case OP_BROADCAST:
        return "broadcast";
    case OP_SENDRECV:
        return "sendrecv";
    case OP_REDUCE:
        return "reduce";
    case OP_GATHER:
        return "gather";
    case OP_SCATTER:
        return "scatter";
    case OP_ALL_TO_ALL:
        return "all_to_all";
    case OP_ALL_TO_ALLV:
        return "all_to_allv";
    }
    return "?";
}

static int op_reduces(enum bench_op op)
{
    return op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER || op == OP_REDUCE;
}

/* The operations that take a root (-R). */
static int op_rooted(enum bench_op op)
{
    return op == OP_BROADCAST || op == OP_REDUCE || op == OP_GATHER ||
           op == OP_SCATTER;
}

/* The operations whose size is the whole nranks * count buffer: count
 * elements per rank (all_gather, reduce_scatter, gather, scatter) or per
 * peer (the all-to-alls). */
static int op_whole(enum bench_op op)
{
    return op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER || op == OP_GATHER ||
           op == OP_SCATTER || op == OP_ALL_TO_ALL || op == OP_ALL_TO_ALLV;
}

/* The operations -N posts with their weft_i* form. */
static int op_nonblocking(enum bench_op op)
{
    return op == OP_ALL_REDUCE || op == OP_REDUCE || op == OP_GATHER ||
           op == OP_SCATTER || op == OP_ALL_TO_ALL || op == OP_ALL_TO_ALLV;
}

/*
 * Per dtype: the name printed (nccl-tests' names), the element size, whether
 * it is signed, the largest magnitude up to which every integer is exact in
 * it (capped at 2^40: the patterns need no more), and the largest k for
 * which +-2^k is exact (the product pattern multiplies powers of two).
 */
struct dtype_info {
    weft_dtype dtype;
    const char *name;
    size_t elem_size;
    int is_signed;
    int64_t exact_max;
    int pow2_max;
};

static const struct dtype_info dtype_table[] = {
    {WEFT_INT8, "int8", 1, 1, 127, 6},
    {WEFT_UINT8, "uint8", 1, 0, 255, 7},
    {WEFT_INT32, "int32", 4, 1, INT32_MAX, 30},
    {WEFT_UINT32, "uint32", 4, 0, UINT32_MAX, 31},
    {WEFT_INT64, "int64", 8, 1, INT64_C(1) << 40, 62},
    {WEFT_UINT64, "uint64", 8, 0, INT64_C(1) << 40, 62},
    {WEFT_FLOAT16, "half", 2, 1, 2048, 15},
    {WEFT_BFLOAT16, "bfloat16", 2, 1, 256, 60},
    {WEFT_FLOAT32, "float", 4, 1, INT64_C(1) << 24, 60},
    {WEFT_FLOAT64, "double", 8, 1, INT64_C(1) << 40, 60},
};

static const struct {
    const char *name;
    weft_dtype dtype;
} dtype_names[] = {
    {"int8", WEFT_INT8},       {"char", WEFT_INT8},
    {"uint8", WEFT_UINT8},     {"int32", WEFT_INT32},
    {"int", WEFT_INT32},       {"uint32", WEFT_UINT32},
    {"int64", WEFT_INT64},     {"uint64", WEFT_UINT64},
    {"half", WEFT_FLOAT16},    {"float16", WEFT_FLOAT16},
    {"fp16", WEFT_FLOAT16},    {"bfloat16", WEFT_BFLOAT16},
    {"bf16", WEFT_BFLOAT16},   {"float", WEFT_FLOAT32},
    {"float32", WEFT_FLOAT32}, {"fp32", WEFT_FLOAT32},
    {"double", WEFT_FLOAT64},  {"float64", WEFT_FLOAT64},
    {"fp64", WEFT_FLOAT64},
};

static const struct dtype_info *dtype_lookup(weft_dtype dtype)
{
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].dtype == dtype)
            return &dtype_table[i];
    return NULL;
}

static const struct {
    const char *name;
    weft_redop redop;
} redop_names[] = {
    {"sum", WEFT_SUM},
    {"prod", WEFT_PROD},
    {"min", WEFT_MIN},
    {"max", WEFT_MAX},
};

static const char *redop_name(weft_redop redop)
{
    for (size_t i = 0; i < sizeof redop_names / sizeof redop_names[0]; i++)
        if (redop_names[i].redop == redop)
            return redop_names[i].name;
    return "?";
}

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

struct bench_opts {
    enum bench_op op;
    uint64_t min_nbytes;
    uint64_t max_nbytes;
    uint64_t step_factor; /* used when step_nbytes == 0 */
    uint64_t step_nbytes; /* > 0: add this instead of multiplying */
    int iters;
    int warmup_iters;
    int check;
    int in_place;
    int nonblocking; /* weft_i* + weft_wait (op_nonblocking's ops) */
    int root;
    int timeout_ms; /* 0: leave the communicator's default */
    weft_dtype dtype;
    weft_redop redop;
};

static const char usage_text[] =
    "usage: weftrun -n N -- weft-bench [options]\n"
    "  -o, --op OP             all_reduce | all_gather | reduce_scatter |\n"
    "                          broadcast | sendrecv | reduce | gather |\n"
    "                          scatter | all_to_all | all_to_allv\n"
    "                          (default all_reduce)\n"
    "  -b, --minbytes SIZE     smallest size in bytes (default 8)\n"
    "  -e, --maxbytes SIZE     largest size in bytes (default 64M)\n"
    "                          SIZE takes a K, M, G or T suffix (1024-based)\n"
    "  -f, --stepfactor F      multiply the size by F >= 2 (default 2)\n"
    "  -i, --stepbytes SIZE    add SIZE instead of multiplying\n"
    "                          (the later of -f and -i wins)\n"
    "  -n, --iters N           timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N    warm-up iterations per size (default 5)\n"
    "  -c, --check 0|1         check every element of the result (default 1)\n"
    "  -d, --datatype TYPE     int8 uint8 int32 uint32 int64 uint64\n"
    "                          half|float16 bfloat16 float|float32\n"
    "                          double|float64 (default float)\n"
    "  -r, --redop OP          sum | prod | min | max (default sum)\n"
    "  -R, --root R            root rank of broadcast, reduce, gather and\n"
    "                          scatter (default 0)\n"
    "  -I, --inplace 0|1       run the in-place form (default 0)\n"
    "  -N, --nonblocking 0|1   all_reduce, reduce, gather, scatter and the\n"
    "                          all-to-alls: post the weft_i* form and\n"
    "                          weft_wait for it, as frameworks do (the\n"
    "                          progress thread runs it; default 0)\n"
    "  -t, --timeout_ms MS     per-operation deadline (weft_set_timeout)\n"
    "  -h, --help              show this text\n"
    "The size is the whole buffer: for all_gather, reduce_scatter, gather,\n"
    "scatter and the all-to-alls nranks * count elements (count per rank or\n"
    "per peer), rounded down to a multiple of nranks * element size, else\n"
    "of the element size; sizes that round to 0 are skipped. all_to_allv\n"
    "sends rank i's block for rank j of count * 2((i + j) % n + 1) / (n + 1)\n"
    "elements (uneven, some empty at small counts). Rank 0 prints one row\n"
    "per size: size count type redop root time(us) algbw(GB/s) busbw(GB/s)\n"
    "#wrong.\n";

/*
 * The rank this process will have, guessed from the launchers' environment
 * before weft_init, or -1. Only used to print the usage text once rather
 * than once per rank.
 */
static int env_rank_hint(void)
{
    static const char *const vars[] = {"WEFT_RANK", "OMPI_COMM_WORLD_RANK",
                                       "PMI_RANK", "SLURM_PROCID", "RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *s = getenv(vars[i]);
        if (s != NULL && *s != '\0')
            return atoi(s);
    }
    return -1;
}

static void print_usage(FILE *f)
{
    fputs(usage_text, f);
}

__attribute__((format(printf, 1, 2), noreturn)) static void
usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("weft-bench: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (env_rank_hint() <= 0)
        print_usage(stderr);
    exit(2);
}

static int parse_int(const char *s, long lo, long hi, const char *what)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        usage_error("%s: '%s' is not an integer in [%ld, %ld]", what, s, lo,
                    hi);
    return (int)v;
}

/* Bytes, with an optional K/M/G/T suffix (1024-based), optionally followed
 * by B or iB ("64M", "64MB", "64MiB", "8"). */
static uint64_t parse_nbytes(const char *s, const char *what)
{
    const char *p = s;
    char *end;
    unsigned long long v;
    uint64_t mult = 1;

    if (*p < '0' || *p > '9')
        usage_error("%s: '%s' is not a size in bytes", what, s);
    errno = 0;
    v = strtoull(p, &end, 10);
    if (errno != 0)
        usage_error("%s: '%s' is too large", what, s);
    switch (*end) {
    case 'k':
    case 'K':
        mult = UINT64_C(1) << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mult = UINT64_C(1) << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mult = UINT64_C(1) << 30;
        end++;
        break;
    case 't':
    case 'T':
        mult = UINT64_C(1) << 40;
        end++;
        break;
    default:
        break;
    }
    if (mult > 1 && (*end == 'i' || *end == 'I') &&
        (end[1] == 'B' || end[1] == 'b'))
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        usage_error("%s: '%s' is not a size in bytes (use K, M, G or T)", what,
                    s);
    if (v > UINT64_MAX / mult)
        usage_error("%s: '%s' is too large", what, s);
    return (uint64_t)v * mult;
}

static void parse_args(int argc, char **argv, struct bench_opts *o)
{
    static const struct option longopts[] = {
        {"op", required_argument, NULL, 'o'},
        {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'},
        {"stepbytes", required_argument, NULL, 'i'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'},
        {"datatype", required_argument, NULL, 'd'},
        {"redop", required_argument, NULL, 'r'},
        {"root", required_argument, NULL, 'R'},
        {"inplace", required_argument, NULL, 'I'},
        {"nonblocking", required_argument, NULL, 'N'},
        {"timeout_ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch;

    *o = (struct bench_opts){
        .op = OP_ALL_REDUCE,
        .min_nbytes = 8,
        .max_nbytes = UINT64_C(64) << 20,
        .step_factor = 2,
        .step_nbytes = 0,
        .iters = 20,
        .warmup_iters = 5,
        .check = 1,
        .in_place = 0,
        .nonblocking = 0,
        .root = 0,
        .timeout_ms = 0,
        .dtype = WEFT_FLOAT32,
        .redop = WEFT_SUM,
    };

    opterr = 0; /* we report bad options ourselves */
    while ((ch = getopt_long(argc, argv, ":o:b:e:f:i:n:w:c:d:r:R:I:N:t:h",
                             longopts, NULL)) != -1) {
        size_t i;
        switch (ch) {
        case 'o':
            for (i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
                if (strcasecmp(optarg, op_names[i].name) == 0)
                    break;
            if (i == sizeof op_names / sizeof op_names[0])
                usage_error("-o: unknown operation '%s'", optarg);
            o->op = op_names[i].op;
            break;
        case 'b':
            o->min_nbytes = parse_nbytes(optarg, "-b");
            break;
        case 'e':
            o->max_nbytes = parse_nbytes(optarg, "-e");
            break;
        case 'f':
            o->step_factor = (uint64_t)parse_int(optarg, 2, INT_MAX, "-f");
            o->step_nbytes = 0;
            break;
        case 'i':
            o->step_nbytes = parse_nbytes(optarg, "-i");
            if (o->step_nbytes == 0)
                usage_error("-i: the increment must be at least 1 byte");
            break;
        case 'n':
            o->iters = parse_int(optarg, 1, INT_MAX, "-n");
            break;
        case 'w':
            o->warmup_iters = parse_int(optarg, 0, INT_MAX, "-w");
            break;
        case 'c':
            o->check = parse_int(optarg, 0, 1, "-c");
            break;
        case 'd':
            for (i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
                if (strcasecmp(optarg, dtype_names[i].name) == 0)
                    break;
            if (i == sizeof dtype_names / sizeof dtype_names[0])
                usage_error("-d: unknown dtype '%s'", optarg);
            o->dtype = dtype_names[i].dtype;
            break;
        case 'r':
            for (i = 0; i < sizeof redop_names / sizeof redop_names[0]; i++)
                if (strcasecmp(optarg, redop_names[i].name) == 0)
                    break;
            if (i == sizeof redop_names / sizeof redop_names[0])
                usage_error("-r: unknown reduction '%s'", optarg);
            o->redop = redop_names[i].redop;
            break;
        case 'R':
            o->root = parse_int(optarg, 0, INT_MAX, "-R");
            break;
        case 'I':
            o->in_place = parse_int(optarg, 0, 1, "-I");
            break;
        case 'N':
            o->nonblocking = parse_int(optarg, 0, 1, "-N");
            break;
        case 't':
            o->timeout_ms = parse_int(optarg, 1, INT_MAX, "-t");
            break;
        case 'h':
            if (env_rank_hint() <= 0)
                print_usage(stdout);
            exit(0);
        case ':':
            usage_error("option '%s' needs an argument", argv[optind - 1]);
        default:
            if (optopt != 0)
                usage_error("unknown option '-%c'", optopt);
            usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        usage_error("unexpected argument '%s'", argv[optind]);
    if (o->min_nbytes > o->max_nbytes)
        usage_error("-b %" PRIu64 " is larger than -e %" PRIu64, o->min_nbytes,
                    o->max_nbytes);
}

/* ------------------------------------------------------------------------ */
/* Failure handling                                                          */

static weft_comm *g_comm;
static int g_rank = -1;

/* Reports a failed weft call, frees the communicator and exits 1. */
__attribute__((noreturn)) static void die_weft(const char *call, int err)
{
    fprintf(stderr, "weft-bench: rank %d: %s failed: %s: %s\n", g_rank, call,
            weft_err_name(err), weft_last_error(g_comm));
    fflush(stderr);
    weft_finalize(g_comm);
    exit(1);
}

#define WCHECK(call, name)                                                     \
    do {                                                                       \
        int err_ = (call);                                                     \
        if (err_ != WEFT_OK)                                                   \
            die_weft((name), err_);                                            \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Data patterns                                                             */

/*
 * Element i of rank r's input is pattern(r, i): a small integer, stored in
 * the dtype. Which integers depends on what will be done to them:
 *  - data movement and min/max: any integer the dtype holds exactly;
 *  - sum: magnitudes up to exact_max / nranks, so every partial sum, in any
 *    order, is an exact integer;
 *  - prod: 1 or 2 (and -1 or -2 on signed dtypes), arranged so that at most
 *    pow2_max ranks contribute a 2 to any element; the product is +-2^k.
 * The salt changes the pattern per size and between the timed and the
 * checked run, so stale data from an earlier run never passes the check.
 */
enum pattern_kind { PAT_MOVE, PAT_SUM, PAT_PROD, PAT_MINMAX };

struct bench {
    struct bench_opts o;
    const struct dtype_info *dt;
    enum pattern_kind kind;
    int rank;
    int nranks;
    int64_t mag;  /* PAT_MOVE/SUM/MINMAX: values in [-mag, mag] or [0, mag] */
    int pow2_cap; /* PAT_PROD: most ranks contributing a factor 2 */
    /* Derived from the current salt by set_salt(): one key per rank, and
     * one shared by all ranks for the product pattern. */
    uint64_t *rank_key;
    uint64_t shared_key;
    unsigned char *sendbuf;
    unsigned char *recvbuf;
    /* Pointers handed to the call for the current size. */
    void *call_send;
    void *call_recv;
    /* all_to_allv: this rank's counts and displacements (elements, nranks
     * entries each) for the current size. */
    size_t *scounts, *sdispls, *rcounts, *rdispls;
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

/* Selects the pattern of one run. */
static void set_salt(struct bench *b, uint64_t salt)
{
    for (int r = 0; r < b->nranks; r++)
        b->rank_key[r] =
            mix64(salt * UINT64_C(0x100000001b3) + (uint64_t)r + 1);
    b->shared_key = mix64(salt ^ UINT64_C(0x9e3779b97f4a7c15));
}

/* h mapped onto [0, span) without a division (Lemire's multiply-shift). */
static uint64_t below(uint64_t h, uint64_t span)
{
#if defined(__SIZEOF_INT128__)
    return (uint64_t)(((unsigned __int128)h * span) >> 64);
#else
    return h % span;
#endif
}

static int64_t pattern(const struct bench *b, int r, uint64_t i)
{
    if (b->kind == PAT_PROD) {
        /* The same h for every rank, so the ranks agree on how many twos. */
        uint64_t h = mix64(i ^ b->shared_key);
        int twos = (int)below(h, (uint64_t)b->pow2_cap + 1);
        int pos = (int)((i + (uint64_t)r) % (uint64_t)b->nranks);
        int64_t v = pos < twos ? 2 : 1;
        if (b->dt->is_signed && ((h >> 40) & 1) && pos == b->nranks - 1)
            v = -v;
        return v;
    }
    uint64_t h = mix64(i + b->rank_key[r]);
    uint64_t m = (uint64_t)b->mag;
    if (b->dt->is_signed)
        return (int64_t)below(h, 2 * m + 1) - (int64_t)m;
    return (int64_t)below(h, m + 1);
}

/* The reduction over all ranks of element i, in exact integer arithmetic. */
static int64_t reduced(const struct bench *b, uint64_t i)
{
    int64_t acc = pattern(b, 0, i);
    for (int r = 1; r < b->nranks; r++) {
        int64_t v = pattern(b, r, i);
        switch (b->o.redop) {
        case WEFT_SUM:
            acc += v;
            break;
        case WEFT_PROD:
            acc *= v;
            break;
        case WEFT_MIN:
            acc = v < acc ? v : acc;
            break;
        case WEFT_MAX:
            acc = v > acc ? v : acc;
            break;
        }
    }
    return acc;
}

/* float -> IEEE half, for values the patterns produce: zero or normal
 * numbers exactly representable in half. */
static uint16_t half_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax == 0)
        return sign;
    int e = (int)(ax >> 23) - 127 + 15;
    return (uint16_t)(sign | (uint32_t)e << 10 | (ax & 0x7fffffu) >> 13);
}

/* float -> bfloat16 for values exactly representable in bfloat16. */
static uint16_t bf16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return (uint16_t)(x >> 16);
}

/* The object representation of integer v in dtype, as an unsigned integer
 * of the dtype's size (so it compares equal to load_bits of the same bytes
 * whatever the byte order). */
static uint64_t encode(weft_dtype dtype, int64_t v)
{
    switch (dtype) {
    case WEFT_INT8:
        return (uint8_t)(int8_t)v;
    case WEFT_UINT8:
        return (uint8_t)v;
    case WEFT_INT32:
        return (uint32_t)(int32_t)v;
    case WEFT_UINT32:
        return (uint32_t)v;
    case WEFT_INT64:
    case WEFT_UINT64:
        return (uint64_t)v;
    case WEFT_FLOAT16:
        return half_bits((float)v);
    case WEFT_BFLOAT16:
        return bf16_bits((float)v);
    case WEFT_FLOAT32: {
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, sizeof x);
        return x;
    }
    case WEFT_FLOAT64: {
        double d = (double)v;
        uint64_t x;
        memcpy(&x, &d, sizeof x);
        return x;
    }
    }
    return 0;
}

static void store_bits(void *buf, size_t idx, size_t elem_size, uint64_t bits)
{
    unsigned char *p = (unsigned char *)buf + idx * elem_size;
    switch (elem_size) {
    case 1: {
        uint8_t x = (uint8_t)bits;
        memcpy(p, &x, 1);
        break;
    }
    case 2: {
        uint16_t x = (uint16_t)bits;
        memcpy(p, &x, 2);
        break;
    }
    case 4: {
        uint32_t x = (uint32_t)bits;
        memcpy(p, &x, 4);
        break;
    }
    default:
        memcpy(p, &bits, 8);
        break;
    }
}

static uint64_t load_bits(const void *buf, size_t idx, size_t elem_size)
{
    const unsigned char *p = (const unsigned char *)buf + idx * elem_size;
    switch (elem_size) {
    case 1: {
        uint8_t x;
        memcpy(&x, p, 1);
        return x;
    }
    case 2: {
        uint16_t x;
        memcpy(&x, p, 2);
        return x;
    }
    case 4: {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    default: {
        uint64_t x;
        memcpy(&x, p, 8);
        return x;
    }
    }
}

/* Whether element idx of buf is bitwise the dtype's encoding of v. */
static int matches(const void *buf, size_t idx, const struct dtype_info *dt,
                   int64_t v)
{
    return load_bits(buf, idx, dt->elem_size) == encode(dt->dtype, v);
}

/* Element j of buf (j in [0, n)) = this rank's pattern at index first + j. */
static void fill(const struct bench *b, void *buf, uint64_t first, size_t n)
{
    for (size_t j = 0; j < n; j++)
        store_bits(buf, j, b->dt->elem_size,
                   encode(b->dt->dtype, pattern(b, b->rank, first + j)));
}

/* Output regions are poisoned before the checked run, so an element the
 * operation never wrote is counted wrong. 0xA5 bytes are never an integer
 * in the float dtypes; in the integer ones a match is a rare accident. */
static void poison(void *buf, size_t nelems, const struct bench *b)
{
    memset(buf, 0xA5, nelems * b->dt->elem_size);
}

/* ------------------------------------------------------------------------ */
/* One size                                                                  */

/* all_to_allv: the elements rank i sends rank j for a nominal count per
 * peer: count * 2((i + j) % n + 1) / (n + 1), from about 2 count / n to
 * about 2 count, some 0 at small counts; each rank sends and receives
 * about n * count in all, never more than 2 n * count. */
static size_t v_count(const struct bench *b, int i, int j, size_t count)
{
    uint64_t n = (uint64_t)b->nranks;
    uint64_t k = (uint64_t)(i + j) % n + 1;
    return (size_t)((uint64_t)count * 2 * k / (n + 1));
}

/* all_to_allv: the displacement of rank i's block for rank j in rank i's
 * sendbuf (its blocks lie in rank order, packed). */
static size_t v_sdispl(const struct bench *b, int i, int j, size_t count)
{
    size_t d = 0;
    for (int p = 0; p < j; p++)
        d += v_count(b, i, p, count);
    return d;
}

/* Sets the pointers handed to the call for count elements (per rank for
 * all_gather and reduce_scatter). */
static void set_call_buffers(struct bench *b, size_t count)
{
    size_t es = b->dt->elem_size;
    size_t block = count * es * (size_t)b->rank;

    b->call_send = b->sendbuf;
    b->call_recv = b->recvbuf;
    if (b->o.op == OP_ALL_TO_ALLV) {
        size_t n = (size_t)b->nranks, so = 0, ro = 0;
        for (size_t p = 0; p < n; p++) {
            b->scounts[p] = v_count(b, b->rank, (int)p, count);
            b->sdispls[p] = so;
            so += b->scounts[p];
            b->rcounts[p] = v_count(b, (int)p, b->rank, count);
            b->rdispls[p] = ro;
            ro += b->rcounts[p];
        }
    }
    if (!b->o.in_place)
        return;
    switch (b->o.op) {
    case OP_ALL_REDUCE:
        b->call_send = b->recvbuf;
        break;
    case OP_ALL_GATHER:
        b->call_send = b->recvbuf + block;
        break;
    case OP_REDUCE_SCATTER:
        b->call_recv = b->sendbuf + block;
        break;
    case OP_REDUCE:
        /* In place on the root only: sendbuf == recvbuf there. */
        if (b->rank == b->o.root)
            b->call_send = b->recvbuf;
        break;
    case OP_GATHER:
        if (b->rank == b->o.root)
            b->call_send = b->recvbuf + count * es * (size_t)b->o.root;
        break;
    case OP_SCATTER:
        if (b->rank == b->o.root)
            b->call_recv = b->sendbuf + count * es * (size_t)b->o.root;
        break;
    case OP_ALL_TO_ALL:
        b->call_send = b->recvbuf;
        break;
    case OP_BROADCAST:
    case OP_SENDRECV:
    case OP_ALL_TO_ALLV:
        break;
    }
}

/* Writes the inputs for one run; with check, poisons the outputs. */
static void init_data(struct bench *b, size_t count, uint64_t salt, int check)
{
    size_t n = (size_t)b->nranks;

    set_salt(b, salt);
    switch (b->o.op) {
    case OP_ALL_REDUCE:
        if (!b->o.in_place && check)
            poison(b->recvbuf, count, b);
        fill(b, b->call_send, 0, count);
        break;
    case OP_ALL_GATHER:
        if (check)
            poison(b->recvbuf, n * count, b);
        fill(b, b->call_send, 0, count);
        break;
    case OP_REDUCE_SCATTER:
        if (!b->o.in_place && check)
            poison(b->recvbuf, count, b);
        fill(b, b->sendbuf, 0, n * count);
        break;
    case OP_BROADCAST:
        if (b->rank == b->o.root)
            fill(b, b->recvbuf, 0, count);
        else if (check)
            poison(b->recvbuf, count, b);
        break;
    case OP_SENDRECV:
        if (check)
            poison(b->recvbuf, count, b);
        fill(b, b->sendbuf, 0, count);
        break;
    case OP_REDUCE:
        if (b->rank == b->o.root && !b->o.in_place && check)
            poison(b->recvbuf, count, b);
        fill(b, b->call_send, 0, count);
        break;
    case OP_GATHER:
        if (b->rank == b->o.root && check)
            poison(b->recvbuf, n * count, b);
        fill(b, b->call_send, 0, count);
        break;
    case OP_SCATTER:
        if (b->rank == b->o.root)
            fill(b, b->sendbuf, 0, n * count);
        if (check && b->call_recv != b->sendbuf + count * b->dt->elem_size *
                                                      (size_t)b->rank)
            poison(b->call_recv, count, b);
        break;
    case OP_ALL_TO_ALL:
        if (!b->o.in_place && check)
            poison(b->recvbuf, n * count, b);
        fill(b, b->call_send, 0, n * count);
        break;
    case OP_ALL_TO_ALLV:
        if (check)
            poison(b->recvbuf, b->rdispls[n - 1] + b->rcounts[n - 1], b);
        fill(b, b->sendbuf, 0, b->sdispls[n - 1] + b->scounts[n - 1]);
        break;
    }
}

static void run_op(struct bench *b, size_t count)
{
    weft_comm *c = g_comm;
    weft_dtype dt = b->o.dtype;
    weft_request *req = NULL;
    weft_request **nb = b->o.nonblocking ? &req : NULL;
    int root = b->o.root;

    switch (b->o.op) {
    case OP_ALL_REDUCE:
        if (nb) {
            WCHECK(weft_iall_reduce(c, b->call_send, b->call_recv, count, dt,
                                    b->o.redop, nb),
                   "weft_iall_reduce");
            break;
        }
        WCHECK(weft_all_reduce(c, b->call_send, b->call_recv, count, dt,
                               b->o.redop),
               "weft_all_reduce");
        break;
    case OP_ALL_GATHER:
        WCHECK(weft_all_gather(c, b->call_send, b->call_recv, count, dt),
               "weft_all_gather");
        break;
    case OP_REDUCE_SCATTER:
        WCHECK(weft_reduce_scatter(c, b->call_send, b->call_recv, count, dt,
                                   b->o.redop),
               "weft_reduce_scatter");
        break;
    case OP_BROADCAST:
        WCHECK(weft_broadcast(c, b->call_recv, count, dt, b->o.root),
               "weft_broadcast");
        break;
    case OP_SENDRECV: {
        /* As nccl-tests: every rank sends to the next and receives from
         * the previous one at the same time. */
        int next = (b->rank + 1) % b->nranks;
        int prev = (b->rank - 1 + b->nranks) % b->nranks;
        WCHECK(
            weft_sendrecv(c, b->call_send, next, b->call_recv, prev, count, dt),
            "weft_sendrecv");
        break;
    }
    case OP_REDUCE:
        if (nb)
            WCHECK(weft_ireduce(c, b->call_send, b->call_recv, count, dt,
                                b->o.redop, root, nb),
                   "weft_ireduce");
        else
            WCHECK(weft_reduce(c, b->call_send, b->call_recv, count, dt,
                               b->o.redop, root),
                   "weft_reduce");
        break;
    case OP_GATHER:
        if (nb)
            WCHECK(weft_igather(c, b->call_send, b->call_recv, count, dt, root,
                                nb),
                   "weft_igather");
        else
            WCHECK(weft_gather(c, b->call_send, b->call_recv, count, dt, root),
                   "weft_gather");
        break;
    case OP_SCATTER:
        if (nb)
            WCHECK(weft_iscatter(c, b->call_send, b->call_recv, count, dt, root,
                                 nb),
                   "weft_iscatter");
        else
            WCHECK(weft_scatter(c, b->call_send, b->call_recv, count, dt, root),
                   "weft_scatter");
        break;
    case OP_ALL_TO_ALL:
        if (nb)
            WCHECK(
                weft_iall_to_all(c, b->call_send, b->call_recv, count, dt, nb),
                "weft_iall_to_all");
        else
            WCHECK(weft_all_to_all(c, b->call_send, b->call_recv, count, dt),
                   "weft_all_to_all");
        break;
    case OP_ALL_TO_ALLV:
        if (nb)
            WCHECK(weft_iall_to_allv(c, b->call_send, b->scounts, b->sdispls,
                                     b->call_recv, b->rcounts, b->rdispls, dt,
                                     nb),
                   "weft_iall_to_allv");
        else
            WCHECK(weft_all_to_allv(c, b->call_send, b->scounts, b->sdispls,
                                    b->call_recv, b->rcounts, b->rdispls, dt),
                   "weft_all_to_allv");
        break;
    }
    if (req != NULL) {
        WCHECK(weft_wait(req), "weft_wait");
        weft_request_free(req);
    }
}

/* Counts the elements of this rank's result that differ from the expected. */
static uint64_t check_data(const struct bench *b, size_t count)
{
    const struct dtype_info *dt = b->dt;
    uint64_t wrong = 0;
    size_t n = (size_t)b->nranks;

    switch (b->o.op) {
    case OP_ALL_REDUCE:
        for (size_t i = 0; i < count; i++)
            wrong += !matches(b->call_recv, i, dt, reduced(b, i));
        break;
    case OP_ALL_GATHER:
        for (size_t r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                wrong += !matches(b->call_recv, r * count + i, dt,
                                  pattern(b, (int)r, i));
        break;
    case OP_REDUCE_SCATTER: {
        uint64_t first = (uint64_t)b->rank * count;
        for (size_t i = 0; i < count; i++)
            wrong += !matches(b->call_recv, i, dt, reduced(b, first + i));
        break;
    }
    case OP_BROADCAST:
        for (size_t i = 0; i < count; i++)
            wrong += !matches(b->call_recv, i, dt, pattern(b, b->o.root, i));
        break;
    case OP_SENDRECV: {
        int prev = (b->rank - 1 + b->nranks) % b->nranks;
        for (size_t i = 0; i < count; i++)
            wrong += !matches(b->call_recv, i, dt, pattern(b, prev, i));
        break;
    }
    case OP_REDUCE:
        if (b->rank == b->o.root)
            for (size_t i = 0; i < count; i++)
                wrong += !matches(b->call_recv, i, dt, reduced(b, i));
        break;
    case OP_GATHER:
        if (b->rank == b->o.root)
            for (size_t r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++)
                    wrong += !matches(b->recvbuf, r * count + i, dt,
                                      pattern(b, (int)r, i));
        break;
    case OP_SCATTER: {
        uint64_t first = (uint64_t)b->rank * count;
        for (size_t i = 0; i < count; i++)
            wrong +=
                !matches(b->call_recv, i, dt, pattern(b, b->o.root, first + i));
        break;
    }
    case OP_ALL_TO_ALL: {
        /* Rank p's block for this rank: its elements rank*count on. */
        uint64_t first = (uint64_t)b->rank * count;
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < count; i++)
                wrong += !matches(b->call_recv, p * count + i, dt,
                                  pattern(b, (int)p, first + i));
        break;
    }
    case OP_ALL_TO_ALLV:
        for (size_t p = 0; p < n; p++) {
            uint64_t first = v_sdispl(b, (int)p, b->rank, count);
            for (size_t i = 0; i < b->rcounts[p]; i++)
                wrong += !matches(b->call_recv, b->rdispls[p] + i, dt,
                                  pattern(b, (int)p, first + i));
        }
        break;
    }
    return wrong;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Elements per call for a requested size in bytes: for all_gather and
 * reduce_scatter per rank, the size being the whole nranks * count buffer. */
static size_t count_for(const struct bench *b, uint64_t nbytes)
{
    uint64_t unit = b->dt->elem_size;
    if (op_whole(b->o.op))
        unit *= (uint64_t)b->nranks;
    return (size_t)(nbytes / unit);
}

/* The whole buffer in bytes (the size column) for count elements per call. */
static uint64_t size_for(const struct bench *b, size_t count)
{
    uint64_t nbytes = (uint64_t)count * b->dt->elem_size;
    if (op_whole(b->o.op))
        nbytes *= (uint64_t)b->nranks;
    return nbytes;
}

/* Elements of sendbuf and recvbuf that count elements per call use, given
 * the form (the in-place forms use only one of them). */
static void buffer_counts(const struct bench *b, size_t count, size_t *nsend,
                          size_t *nrecv)
{
    size_t n = (size_t)b->nranks;
    int ip = b->o.in_place;

    switch (b->o.op) {
    case OP_ALL_REDUCE:
        *nsend = ip ? 0 : count;
        *nrecv = count;
        return;
    case OP_ALL_GATHER:
        *nsend = ip ? 0 : count;
        *nrecv = n * count;
        return;
    case OP_REDUCE_SCATTER:
        *nsend = n * count;
        *nrecv = ip ? 0 : count;
        return;
    case OP_BROADCAST:
        *nsend = 0;
        *nrecv = count;
        return;
    case OP_SENDRECV:
        *nsend = count;
        *nrecv = count;
        return;
    case OP_REDUCE:
        *nsend = count;
        *nrecv = count;
        return;
    case OP_GATHER:
        *nsend = count;
        *nrecv = n * count;
        return;
    case OP_SCATTER:
        *nsend = n * count;
        *nrecv = count;
        return;
    case OP_ALL_TO_ALL:
        *nsend = ip ? 0 : n * count;
        *nrecv = n * count;
        return;
    case OP_ALL_TO_ALLV:
        *nsend = 2 * n * count;
        *nrecv = 2 * n * count;
        return;
    }
    *nsend = *nrecv = count;
}

static double busbw_factor(const struct bench *b)
{
    double n = (double)b->nranks;
    switch (b->o.op) {
    case OP_ALL_REDUCE:
        return 2.0 * (n - 1.0) / n;
    case OP_ALL_GATHER:
    case OP_REDUCE_SCATTER:
    case OP_GATHER:
    case OP_SCATTER:
    case OP_ALL_TO_ALL:
    case OP_ALL_TO_ALLV:
        return (n - 1.0) / n;
    case OP_BROADCAST:
    case OP_SENDRECV:
    case OP_REDUCE:
        return 1.0;
    }
    return 1.0;
}

/* The next requested size, or 0 when the sequence is over. */
static uint64_t next_nbytes(const struct bench_opts *o, uint64_t nbytes)
{
    if (o->step_nbytes > 0) {
        if (nbytes > o->max_nbytes - o->step_nbytes)
            return 0;
        return nbytes + o->step_nbytes;
    }
    if (nbytes == 0)
        return o->max_nbytes >= 1 ? 1 : 0;
    if (nbytes > o->max_nbytes / o->step_factor)
        return 0;
    return nbytes * o->step_factor;
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    struct bench b;
    struct bench_opts *o = &b.o;
    int err;

    memset(&b, 0, sizeof b);
    parse_args(argc, argv, o);
    b.dt = dtype_lookup(o->dtype);

    err = weft_init(&g_comm);
    if (err != WEFT_OK) {
        char rank_text[16] = "?";
        if (env_rank_hint() >= 0)
            snprintf(rank_text, sizeof rank_text, "%d", env_rank_hint());
        fprintf(stderr, "weft-bench: rank %s: weft_init failed: %s: %s\n",
                rank_text, weft_err_name(err), weft_last_error(NULL));
        return 1;
    }
    b.rank = g_rank = weft_rank(g_comm);
    b.nranks = weft_size(g_comm);
    if (o->timeout_ms > 0)
        WCHECK(weft_set_timeout(g_comm, o->timeout_ms), "weft_set_timeout");

    if (op_rooted(o->op) && o->root >= b.nranks) {
        if (b.rank == 0)
            fprintf(stderr, "weft-bench: -R %d: root must be below %d ranks\n",
                    o->root, b.nranks);
        weft_finalize(g_comm);
        return 2;
    }
    if (o->op == OP_BROADCAST)
        o->in_place = 1; /* weft_broadcast has one buffer */
    int ignored_in_place =
        (o->op == OP_SENDRECV || o->op == OP_ALL_TO_ALLV) && o->in_place;
    if (o->op == OP_SENDRECV || o->op == OP_ALL_TO_ALLV)
        o->in_place = 0; /* send and receive need their own buffers */

    if (!op_reduces(o->op)) {
        b.kind = PAT_MOVE;
        b.mag = b.dt->exact_max;
    } else if (o->redop == WEFT_SUM) {
        b.kind = PAT_SUM;
        b.mag = b.dt->exact_max / b.nranks;
    } else if (o->redop == WEFT_PROD) {
        b.kind = PAT_PROD;
        b.pow2_cap = b.dt->pow2_max < b.nranks ? b.dt->pow2_max : b.nranks;
    } else {
        b.kind = PAT_MINMAX;
        b.mag = b.dt->exact_max;
    }

    /* Allocate once, for the largest size of the sequence. */
    size_t max_send = 0, max_recv = 0;
    for (uint64_t nb = o->min_nbytes;;) {
        size_t s, r;
        buffer_counts(&b, count_for(&b, nb), &s, &r);
        max_send = s > max_send ? s : max_send;
        max_recv = r > max_recv ? r : max_recv;
        nb = next_nbytes(o, nb);
        if (nb == 0)
            break;
    }
    int alloc_ok = 1, all_ok = 0;
    b.sendbuf = malloc(max_send * b.dt->elem_size + 1);
    b.recvbuf = malloc(max_recv * b.dt->elem_size + 1);
    b.rank_key = calloc((size_t)b.nranks, sizeof *b.rank_key);
    b.scounts = calloc(4 * (size_t)b.nranks, sizeof *b.scounts);
    if (b.scounts != NULL) {
        b.sdispls = b.scounts + b.nranks;
        b.rcounts = b.sdispls + b.nranks;
        b.rdispls = b.rcounts + b.nranks;
    }
    if (b.sendbuf == NULL || b.recvbuf == NULL || b.rank_key == NULL ||
        b.scounts == NULL) {
        fprintf(stderr,
                "weft-bench: rank %d: cannot allocate %zu + %zu bytes\n",
                b.rank, max_send * b.dt->elem_size, max_recv * b.dt->elem_size);
        alloc_ok = 0;
    }
    /* Every rank learns whether every rank has its buffers. */
    WCHECK(weft_all_reduce(g_comm, &alloc_ok, &all_ok, 1, WEFT_INT32, WEFT_MIN),
           "weft_all_reduce");
    if (!all_ok) {
        free(b.sendbuf);
        free(b.recvbuf);
        free(b.rank_key);
        free(b.scounts);
        weft_finalize(g_comm);
        return 1;
    }

    int r0 = b.rank == 0;
    const char *redop_col = op_reduces(o->op) ? redop_name(o->redop) : "none";
    int root_col = op_rooted(o->op) ? o->root : -1;

    if (r0) {
        printf("# weft-bench: op %s, %d ranks, dtype %s, redop %s, iters %d, "
               "warmup %d, check %d\n",
               op_name(o->op), b.nranks, b.dt->name, redop_col, o->iters,
               o->warmup_iters, o->check);
        if (o->step_nbytes > 0)
            printf("#   minBytes %" PRIu64 " maxBytes %" PRIu64
                   " step: %" PRIu64 "(bytes)",
                   o->min_nbytes, o->max_nbytes, o->step_nbytes);
        else
            printf("#   minBytes %" PRIu64 " maxBytes %" PRIu64
                   " step: %" PRIu64 "(factor)",
                   o->min_nbytes, o->max_nbytes, o->step_factor);
        printf(" in-place %d root %d timeout_ms ", o->in_place, root_col);
        if (o->timeout_ms > 0)
            printf("%d\n", o->timeout_ms);
        else
            printf("default\n");
        if (ignored_in_place)
            printf("#   -I 1 has no effect on %s\n", op_name(o->op));
        if (o->nonblocking)
            printf("#   non-blocking: weft_i%s + weft_wait%s\n", op_name(o->op),
                   op_nonblocking(o->op) ? ""
                                         : " (not this operation: ignored)");
        printf("#   size: %s; busbw = algbw * %s\n",
               op_whole(o->op) ? "the whole nranks * count buffer"
                               : "count elements",
               o->op == OP_ALL_REDUCE ? "2(n-1)/n"
               : op_whole(o->op)      ? "(n-1)/n"
                                      : "1");
        printf("#   time: the slowest rank's average per operation; "
               "GB = 1e9 bytes\n");
        printf("#\n");
        printf("#%11s  %12s  %8s  %6s  %6s  %11s  %11s  %11s  %6s\n", "size",
               "count", "type", "redop", "root", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "#wrong");
        fflush(stdout);
    }

    if (o->nonblocking && !op_nonblocking(o->op))
        o->nonblocking = 0;
    if (o->op == OP_SENDRECV && b.nranks < 2) {
        if (r0)
            printf("# sendrecv needs at least 2 ranks: nothing to measure\n"
                   "# Avg bus bandwidth : 0.000\n");
        free(b.sendbuf);
        free(b.recvbuf);
        free(b.rank_key);
        free(b.scounts);
        weft_finalize(g_comm);
        return 0;
    }

    double busbw_sum = 0.0;
    int rows = 0;
    uint64_t wrong_total = 0;
    uint64_t salt = 0;

    for (uint64_t nb = o->min_nbytes;;) {
        size_t count = count_for(&b, nb);
        if (count > 0) {
            set_call_buffers(&b, count);

            salt++;
            init_data(&b, count, salt, 0);
            WCHECK(weft_barrier(g_comm), "weft_barrier");
            for (int it = 0; it < o->warmup_iters; it++)
                run_op(&b, count);
            WCHECK(weft_barrier(g_comm), "weft_barrier");
            double t0 = now_s();
            for (int it = 0; it < o->iters; it++)
                run_op(&b, count);
            double t_us = (now_s() - t0) * 1e6 / o->iters;

            double t_max_us = 0.0;
            WCHECK(weft_all_reduce(g_comm, &t_us, &t_max_us, 1, WEFT_FLOAT64,
                                   WEFT_MAX),
                   "weft_all_reduce");

            uint64_t wrong = 0, wrong_sum = 0;
            if (o->check) {
                salt++;
                init_data(&b, count, salt, 1);
                run_op(&b, count);
                wrong = check_data(&b, count);
                WCHECK(weft_all_reduce(g_comm, &wrong, &wrong_sum, 1,
                                       WEFT_UINT64, WEFT_SUM),
                       "weft_all_reduce");
                wrong_total += wrong_sum;
            }

            uint64_t size = size_for(&b, count);
            double algbw = t_max_us > 0 ? (double)size / t_max_us / 1e3 : 0.0;
            double busbw = algbw * busbw_factor(&b);
            busbw_sum += busbw;
            rows++;
            if (r0) {
                char wrong_col[32];
                if (o->check)
                    snprintf(wrong_col, sizeof wrong_col, "%" PRIu64,
                             wrong_sum);
                else
                    snprintf(wrong_col, sizeof wrong_col, "N/A");
                printf("%12" PRIu64 "  %12zu  %8s  %6s  %6d  %11.2f  %11.2f  "
                       "%11.2f  %6s\n",
                       size, count, b.dt->name, redop_col, root_col, t_max_us,
                       algbw, busbw, wrong_col);
                fflush(stdout);
            }
        }
        nb = next_nbytes(o, nb);
        if (nb == 0)
            break;
    }

    if (r0) {
        if (rows == 0)
            printf("# no size in [%" PRIu64 ", %" PRIu64
                   "] holds a whole element per rank\n",
                   o->min_nbytes, o->max_nbytes);
        printf("# Avg bus bandwidth : %.3f\n",
               rows > 0 ? busbw_sum / rows : 0.0);
        if (wrong_total > 0)
            printf("# Errors: %" PRIu64 " wrong elements\n", wrong_total);
        fflush(stdout);
    }

    free(b.sendbuf);
    free(b.recvbuf);
    free(b.rank_key);
    free(b.scounts);
    err = weft_finalize(g_comm);
    if (err != WEFT_OK) {
        /* The communicator is gone; its last error cannot be asked for. */
        fprintf(stderr, "weft-bench: rank %d: weft_finalize failed: %s: %s\n",
                b.rank, weft_err_name(err), weft_strerror(err));
        return 1;
    }
    return wrong_total > 0 ? 1 : 0;
}
