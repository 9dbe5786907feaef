/* How long the transports' waits spin before they sleep
 * (src/transport/common.c, weft__spin): the length that shm, TCP and
 * ibverbs progress() read, and change after each sleep. */
#include "transport/common.h"

#include <criterion/criterion.h>

#define US 1000u

/* A spin set up as a transport sets it up: WEFT_SPIN_US = spin_us, and
 * whether the host has a core per rank. */
static void spin_init(weft__spin *s, int spin_us, int own_core)
{
    weft__config cfg = {.spin_us = spin_us, .own_core = own_core};

    weft__spin_init(s, &cfg);
}

Test(spin, starts_at_the_setting)
{
    weft__spin s;

    spin_init(&s, 50, 1);
    cr_assert_eq(s.cur_ns, 50 * US);
    cr_assert_eq(s.max_ns, 50 * US * WEFT__SPIN_GROWTH);
}

/* Sleeps that a longer spin would have caught: the spin doubles up to 20
 * times the setting and stays there. */
Test(spin, short_sleeps_lengthen_it_to_the_cap)
{
    weft__spin s;
    uint64_t want = 50 * US;

    spin_init(&s, 50, 1);
    for (int i = 0; i < 10; i++) {
        weft__spin_slept(&s, 30 * US);
        want = want * 2 > 1000 * US ? 1000 * US : want * 2;
        cr_assert_eq(s.cur_ns, want, "after %d sleeps: %llu ns", i + 1,
                     (unsigned long long)s.cur_ns);
    }
    cr_assert_eq(s.cur_ns, 1000 * US);
}

/* Long sleeps (a peer that is busy elsewhere): the spin halves back to the
 * setting and never goes below it. */
Test(spin, long_sleeps_shorten_it_to_the_setting)
{
    weft__spin s;

    spin_init(&s, 50, 1);
    for (int i = 0; i < 5; i++)
        weft__spin_slept(&s, 10 * US);
    cr_assert_eq(s.cur_ns, 1000 * US);
    weft__spin_slept(&s, 4001 * US);
    cr_assert_eq(s.cur_ns, 500 * US);
    for (int i = 0; i < 10; i++)
        weft__spin_slept(&s, 100000 * US);
    cr_assert_eq(s.cur_ns, 50 * US);
}

/* Between the two (slept longer than the spin, at most four times it):
 * unchanged. */
Test(spin, middling_sleeps_leave_it)
{
    weft__spin s;

    spin_init(&s, 50, 1);
    weft__spin_slept(&s, 51 * US);
    cr_assert_eq(s.cur_ns, 50 * US);
    weft__spin_slept(&s, 200 * US);
    cr_assert_eq(s.cur_ns, 50 * US);
}

/* Without a core per rank a longer spin would take a core another rank
 * needs: it stays at the setting. WEFT_SPIN_US=0 never spins. */
Test(spin, fixed_without_a_core_per_rank_or_at_zero)
{
    weft__spin s;

    spin_init(&s, 50, 0);
    weft__spin_slept(&s, 1 * US);
    cr_assert_eq(s.cur_ns, 50 * US);
    spin_init(&s, 0, 1);
    weft__spin_slept(&s, 0);
    weft__spin_slept(&s, 1 * US);
    cr_assert_eq(s.cur_ns, 0);
}

/* On weft's progress thread the spin is WEFT_SPIN_US whatever the sleeps
 * (the application's threads may need the core); the length learned on
 * the application's threads is kept for them. */
Test(spin, the_progress_thread_spins_the_setting)
{
    weft__spin s;

    spin_init(&s, 50, 1);
    weft__spin_slept(&s, 10 * US);
    cr_assert_eq(weft__spin_len(&s, UINT64_MAX), 100 * US);
    weft__on_progress_thread = 1;
    cr_assert_eq(weft__spin_len(&s, UINT64_MAX), 50 * US);
    weft__spin_slept(&s, 10 * US);
    weft__spin_slept(&s, 100000 * US);
    weft__on_progress_thread = 0;
    cr_assert_eq(weft__spin_len(&s, UINT64_MAX), 100 * US);
}

/* A learned spin longer than WEFT_SPIN_US ends at the deadline; one that
 * is past is no spin at all. WEFT_SPIN_US itself is left as it was. */
Test(spin, a_longer_spin_ends_at_the_deadline)
{
    weft__spin s;
    uint64_t now_ms = weft__now_ms();

    spin_init(&s, 50, 1);
    cr_assert_eq(weft__spin_len(&s, now_ms), 50 * US);
    for (int i = 0; i < 5; i++)
        weft__spin_slept(&s, 10 * US);
    cr_assert_eq(weft__spin_len(&s, now_ms + 60000), 1000 * US);
    cr_assert_eq(weft__spin_len(&s, now_ms > 0 ? now_ms - 1 : 0), 0);
}
