/*
 * For tests that hand weft (or weftrun) a FIFO where a file is expected:
 * makes one named `name` in a fresh directory, runs `expect` on its path,
 * and removes both. Opening a FIFO for reading blocks until a writer comes,
 * so what is tested is that it is refused before it is opened.
 */
#ifndef WEFT_TESTS_FIFO_H
#define WEFT_TESTS_FIFO_H

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static inline void with_fifo(const char *name, void (*expect)(const char *path))
{
    char dir[] = "/tmp/weft-fifo-XXXXXX", fifo[64];

    cr_assert_not_null(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/%s", dir, name);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    expect(fifo);
    unlink(fifo);
    rmdir(dir);
}

#endif
