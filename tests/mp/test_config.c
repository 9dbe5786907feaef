/*
 * weft_init_config and weft_listener (API.md, "A communicator without the
 * environment"): communicators made from a config, several in one process
 * at once, with a hostile environment that a set field must never read,
 * and every bad config refused with a message naming the field and with
 * the listener closed.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config_cases.h"
#include "weft.h"

extern char **environ;

/* What weft_init would read, every one of them wrong. */
static const char *const hostile[][2] = {
    {"WEFT_RANK", "9"},
    {"WEFT_SIZE", "2"},
    {"RANK", "banana"},
    {"WORLD_SIZE", "-1"},
    {"WEFT_HOSTFILE", "/nonexistent/hostfile"},
    {"WEFT_HOSTFILE_TEXT", "{not json"},
    {"WEFT_JOB_TOKEN", "zz"},
    {"WEFT_TIMEOUT_MS", "soon"},
    {"WEFT_CONNECT_TIMEOUT_MS", "-5"},
    {"WEFT_WIRES", "99"},
    {"WEFT_TRANSPORT", "carrier-pigeon"},
    {"WEFT_TOPOLOGY", "star"},
};

static void set_hostile(void)
{
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++)
        setenv(hostile[i][0], hostile[i][1], 1);
}

/* The environment as one string, to see that nothing changed it. */
static char *env_snapshot(void)
{
    size_t len = 1;
    char *s;

    for (char **e = environ; *e; e++)
        len += strlen(*e) + 1;
    s = calloc(1, len);
    cr_assert_not_null(s);
    for (char **e = environ; *e; e++) {
        strcat(s, *e);
        strcat(s, "\n");
    }
    return s;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    cr_assert_not_null(d);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static void run_jobs(struct cfg_jobs j)
{
    char why[512];
    int rc = cfg_run_jobs(&j, why, sizeof why);
    cr_assert_eq(rc, 0, "%s", why);
}

Test(config, two_jobs_of_three_threads_with_hostile_environment, .timeout = 60)
{
    char *before, *after;

    set_hostile();
    before = env_snapshot();
    run_jobs((struct cfg_jobs){
        .njobs = 2, .nranks = 3, .rounds = 2, .timeout_ms = 20000});
    after = env_snapshot();
    cr_assert_str_eq(after, before, "weft changed the environment");
    free(before);
    free(after);
}

Test(config, four_jobs_hostfile_text_and_late_rank, .timeout = 60)
{
    set_hostile();
    run_jobs((struct cfg_jobs){.njobs = 4,
                               .nranks = 2,
                               .rounds = 1,
                               .boot = CFG_BOOT_TEXT,
                               .late_rank = 1,
                               .late_ms = 500,
                               .timeout_ms = 20000});
}

Test(config, mesh_of_five_and_ring_of_four, .timeout = 60)
{
    set_hostile();
    run_jobs((struct cfg_jobs){.njobs = 1,
                               .nranks = 5,
                               .rounds = 1,
                               .topology = "mesh",
                               .timeout_ms = 20000});
    run_jobs((struct cfg_jobs){.njobs = 1,
                               .nranks = 4,
                               .rounds = 1,
                               .topology = "ring",
                               .timeout_ms = 20000});
}

Test(config, one_rank_needs_no_addresses, .timeout = 30)
{
    weft_config cfg;
    weft_comm *c;
    double x = 2.5;

    set_hostile();
    memset(&cfg, 0, sizeof cfg);
    cfg.size = 1;
    cfg.token = "00112233445566778899aabbccddeeff";
    cfg.timeout_ms = 1000;
    cfg.connect_timeout_ms = 1000;
    cfg.wires = 1;
    cfg.transport = "tcp";
    cfg.topology = "auto";
    cr_assert_eq(weft_init_config(&c, &cfg), WEFT_OK, "%s",
                 weft_last_error(NULL));
    cr_assert_eq(weft_all_reduce(c, &x, &x, 1, WEFT_FLOAT64, WEFT_SUM), 0);
    cr_assert_eq(x, 2.5);
    weft_finalize(c);
}

/* An unset field still comes from the environment, as weft_init's would. */
Test(config, unset_field_reads_the_environment, .timeout = 30)
{
    weft_config cfg;
    weft_comm *c = (weft_comm *)&cfg;

    memset(&cfg, 0, sizeof cfg);
    cfg.size = 1;
    setenv("WEFT_TIMEOUT_MS", "soon", 1);
    cr_assert_eq(weft_init_config(&c, &cfg), WEFT_ECONFIG);
    cr_assert_null(c);
    cr_assert_not_null(strstr(weft_last_error(NULL), "WEFT_TIMEOUT_MS"), "%s",
                       weft_last_error(NULL));
    setenv("WEFT_TIMEOUT_MS", "1234", 1);
    cr_assert_eq(weft_init_config(&c, &cfg), WEFT_OK, "%s",
                 weft_last_error(NULL));
    weft_finalize(c);
}

/* In a config given to refused(): the listener's address and a peer's. */
#define LISTENER_ADDRS ((const char *const *)1)

/* A config that must be refused: the code, a message holding want, no
 * communicator, and the listener (when one is given) closed with nothing
 * else left open. */
static void refused(weft_config cfg, int with_listener, int code,
                    const char *want)
{
    weft_listener *l = NULL;
    char addr[32], a1[32];
    const char *addrs[2] = {addr, a1};
    weft_comm *c = (weft_comm *)&cfg;
    int fds = count_fds(), rc;

    snprintf(a1, sizeof a1, "127.0.0.1:9");
    if (with_listener) {
        cr_assert_eq(weft_listener_open(&l, "127.0.0.1", addr, sizeof addr), 0,
                     "%s", weft_last_error(NULL));
        cfg.listener = l;
        if (cfg.addrs == LISTENER_ADDRS)
            cfg.addrs = addrs;
    }
    rc = weft_init_config(&c, &cfg);
    cr_expect_eq(rc, code, "%s: got %s (%s)", want, weft_err_name(rc),
                 weft_last_error(NULL));
    cr_expect_null(c);
    cr_expect_not_null(strstr(weft_last_error(NULL), want),
                       "expected \"%s\" in: %s", want, weft_last_error(NULL));
    cr_expect_eq(count_fds(), fds, "%s: descriptors left open", want);
}

/* Every field set (so the hostile environment is never read), rank 0 of
 * 2, the addresses those of refused()'s listener and a peer. */
static weft_config base(void)
{
    weft_config cfg;

    memset(&cfg, 0, sizeof cfg);
    cfg.rank = 0;
    cfg.size = 2;
    cfg.addrs = LISTENER_ADDRS;
    cfg.token = "00112233445566778899aabbccddeeff";
    cfg.timeout_ms = 1000;
    cfg.connect_timeout_ms = 500;
    cfg.wires = 1;
    cfg.transport = "tcp";
    cfg.topology = "auto";
    return cfg;
}

Test(config, bad_configs_are_refused_and_close_the_listener, .timeout = 60)
{
    weft_config cfg;
    const char *one[] = {"127.0.0.1:5000", "127.0.0.1:5000"};
    const char *garbage[] = {"nope", "127.0.0.1:5001"};
    const char *null_one[] = {"127.0.0.1:5000", NULL};

    set_hostile();
    cr_assert_eq(weft_init_config(NULL, &(weft_config){.size = 1}),
                 WEFT_EINVAL);
    cr_assert_eq(weft_init_config((weft_comm **)&cfg, NULL), WEFT_EINVAL);
    cr_assert_not_null(strstr(weft_last_error(NULL), "cfg is NULL"));

    cfg = base();
    cfg.size = 0;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.size");
    cfg = base();
    cfg.rank = 2;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.rank");
    cfg = base();
    cfg.rank = -1;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.rank");
    cfg = base();
    cfg.token = "0011";
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.token");
    cfg = base();
    cfg.token = "0011223344556677889900aabbccddXX";
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.token");
    cfg = base();
    cfg.timeout_ms = -5;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.timeout_ms");
    cfg = base();
    cfg.connect_timeout_ms = -1;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.connect_timeout_ms");
    cfg = base();
    cfg.wires = 17;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.wires");
    cfg = base();
    cfg.transport = "udp";
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.transport");
    cfg = base();
    cfg.topology = "star";
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.topology");
    cfg = base();
    cfg.hostfile_text = "{\"hosts\": [{\"name\": \"a\", \"ranks\": 2}]}";
    refused(cfg, 1, WEFT_ECONFIG, "both set");
    cfg = base();
    cfg.addrs = NULL;
    cfg.hostfile_text = "{\"hosts\": [{\"name\": \"a\", \"ranks\": 3}]}";
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.hostfile_text");
    cfg = base();
    cfg.addrs = one;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.addrs");
    cfg = base();
    cfg.addrs = garbage;
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.addrs");
    cfg = base();
    cfg.addrs = null_one;
    refused(cfg, 1, WEFT_ECONFIG, "NULL");
    /* The listener is not at this rank's address. */
    cfg = base();
    cfg.addrs = NULL;
    cfg.hostfile_text = "{\"hosts\": [{\"name\": \"a\", \"ranks\": 2, "
                        "\"ports\": [9, 10]}], \"links\": []}";
    refused(cfg, 1, WEFT_ECONFIG, "weft_config.listener");
    /* No hostfile, no addrs: the environment's, and it is hostile. */
    cfg = base();
    cfg.addrs = NULL;
    refused(cfg, 0, WEFT_ECONFIG, "/nonexistent/hostfile");
}

/* A peer that never comes: the connect deadline, the listener closed. */
Test(config, missing_peer_times_out, .timeout = 30)
{
    weft_config cfg = base();

    /* libuv opens a pipe of its own for the process with its first loop;
     * a job first, so that refused() counts only what this init leaves. */
    run_jobs((struct cfg_jobs){
        .njobs = 1, .nranks = 2, .rounds = 1, .timeout_ms = 5000});
    cfg.connect_timeout_ms = 300;
    refused(cfg, 1, WEFT_ETIMEDOUT, "not connected");
}

Test(config, listener_open, .timeout = 30)
{
    weft_listener *l = (weft_listener *)&l;
    char addr[32], tiny[4];
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int fd, fds = count_fds();

    cr_assert_eq(weft_listener_open(NULL, NULL, addr, sizeof addr),
                 WEFT_EINVAL);
    cr_assert_eq(weft_listener_open(&l, NULL, NULL, 32), WEFT_EINVAL);
    cr_assert_null(l);
    cr_assert_eq(weft_listener_open(&l, NULL, tiny, sizeof tiny), WEFT_EINVAL);
    cr_assert_not_null(strstr(weft_last_error(NULL), "too short"));
    cr_assert_eq(
        weft_listener_open(&l, "no-such-host.invalid", addr, sizeof addr),
        WEFT_ECONFIG);
    cr_assert_not_null(strstr(weft_last_error(NULL), "no-such-host.invalid"));
    cr_assert_eq(weft_listener_open(&l, "192.0.2.1", addr, sizeof addr),
                 WEFT_ETRANSPORT, "binding an address this host lacks");
    cr_assert_eq(count_fds(), fds);
    cr_assert_eq(weft_listener_close(NULL), WEFT_OK);

    cr_assert_eq(weft_listener_open(&l, NULL, addr, sizeof addr), WEFT_OK);
    cr_assert_eq(strncmp(addr, "127.0.0.1:", 10), 0, "%s", addr);
    /* It listens already: a connection is accepted into its backlog. */
    sa.sin_port = htons((uint16_t)atoi(addr + 10));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
    cr_assert_eq(weft_listener_close(l), WEFT_OK);
    cr_assert_eq(count_fds(), fds);
}

/* weft_config grows at its end (weft.h): the header's macro passes the
 * size the program knows, a program built against 0.1's header calls
 * weft_init_config itself with 0.1's struct, and fields a program does
 * not know are zero; a size smaller than any version's is refused. */
Test(config, struct_size_and_version, .timeout = 60)
{
    int (*v1)(weft_comm **, const weft_config *) = weft_init_config;
    struct {
        weft_config cfg;
        char later[64]; /* a newer header's fields, zero */
    } big;
    weft_config cfg = {.rank = 0, .size = 1};
    weft_comm *c = NULL;
    char want[32];

    cr_assert_eq(v1(&c, &cfg), WEFT_OK, "%s", weft_last_error(NULL));
    cr_assert_eq(weft_size(c), 1);
    weft_finalize(c);
    memset(&big, 0, sizeof big);
    big.cfg.size = 1;
    cr_assert_eq(weft_init_config_sized(&c, &big.cfg, sizeof big), WEFT_OK,
                 "%s", weft_last_error(NULL));
    weft_finalize(c);
    cr_assert_eq(weft_init_config_sized(&c, &cfg, 8), WEFT_EINVAL);
    cr_assert_null(c);
    cr_assert_not_null(strstr(weft_last_error(NULL), "smaller than any"));
    cr_assert_eq(weft_init_config_sized(&c, NULL, sizeof cfg), WEFT_EINVAL);
    snprintf(want, sizeof want, "%d.%d.%d", WEFT_VERSION_MAJOR,
             WEFT_VERSION_MINOR, WEFT_VERSION_PATCH);
    cr_assert_str_eq(weft_version(), want);
}
