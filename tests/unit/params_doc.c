/*
 * Prints the table of weft's variables as Markdown, from the table the
 * configuration loader reads them by (src/topo/params.c): `user`, the
 * README's rows; `all`, docs/reference.md's. scripts/gen-docs writes them
 * into both; tests/unit/docs-params.sh checks that they are there.
 */
#include "topo/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    unsigned flags;
    size_t len;
    char *s;

    if (argc != 2 ||
        (strcmp(argv[1], "user") != 0 && strcmp(argv[1], "all") != 0)) {
        fprintf(stderr, "usage: %s user|all\n", argv[0]);
        return 2;
    }
    flags = strcmp(argv[1], "user") == 0 ? WEFT__PF_USER : 0;
    len = weft__params_markdown(flags, NULL, 0) + 1;
    if ((s = malloc(len)) == NULL)
        return 1;
    weft__params_markdown(flags, s, len);
    /* docs/reference.md links to its own sections, the README into it. */
    for (char *at = s; *at != '\0'; at++) {
        static const char self[] = "(docs/reference.md#";
        if (flags == 0 && strncmp(at, self, sizeof self - 1) == 0) {
            putchar('(');
            at += sizeof self - 2 - 1;
            continue;
        }
        putchar(*at);
    }
    free(s);
    return 0;
}
