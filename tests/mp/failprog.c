/*
 * A weft program for launcher tests: runs all_reduces and, in one rank,
 * fails in the middle in the way argv[1] asks ("exit": _exit(7) without
 * finalize; "stop": SIGSTOP itself; "ok": nothing). Ranks whose operation
 * fails print the error and exit 3, as a real program would.
 */
#include <weft.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    int victim = argc > 2 ? atoi(argv[2]) : 1;
    float buf[1024];
    weft_comm *c;
    int rc;

    if ((rc = weft_init(&c)) != WEFT_OK) {
        fprintf(stderr, "init: %s: %s\n", weft_err_name(rc),
                weft_last_error(NULL));
        return 2;
    }
    for (int i = 0; i < 10; i++) {
        if (i == 5 && weft_rank(c) == victim) {
            if (strcmp(mode, "exit") == 0)
                _exit(7);
            if (strcmp(mode, "stop") == 0)
                raise(SIGSTOP);
        }
        for (int k = 0; k < 1024; k++)
            buf[k] = (float)(weft_rank(c) + k);
        rc = weft_all_reduce(c, buf, buf, 1024, WEFT_FLOAT32, WEFT_SUM);
        if (rc != WEFT_OK) {
            fprintf(stderr, "all_reduce %d: %s: %s\n", i, weft_err_name(rc),
                    weft_last_error(c));
            weft_finalize(c);
            return 3;
        }
    }
    printf("done\n");
    weft_finalize(c);
    return 0;
}
