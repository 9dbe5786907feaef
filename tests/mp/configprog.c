/*
 * Communicators made with weft_init_config, many at once in one process
 * (config_cases.h), as a plain program: CI runs it under ThreadSanitizer,
 * which Criterion cannot run under. Exits 0 when every rank passed.
 */
#include "config_cases.h"

#include <stdio.h>

int main(void)
{
    static const struct cfg_jobs jobs[] = {
        {.njobs = 3, .nranks = 3, .rounds = 2, .timeout_ms = 60000},
        {.njobs = 2,
         .nranks = 2,
         .rounds = 1,
         .boot = CFG_BOOT_TEXT,
         .late_rank = 1,
         .late_ms = 300,
         .timeout_ms = 60000},
        {.njobs = 1,
         .nranks = 4,
         .rounds = 1,
         .topology = "ring",
         .timeout_ms = 60000},
    };
    char why[512];

    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++)
        if (cfg_run_jobs(&jobs[i], why, sizeof why) != 0) {
            fprintf(stderr, "configprog: case %zu: %s\n", i, why);
            return 1;
        }
    printf("configprog: every rank passed\n");
    return 0;
}
