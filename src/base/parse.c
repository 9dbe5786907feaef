/*
 * Reading numbers from text (see parse.h). One function, in a file of its
 * own, so that weftrun can be built with it without the rest of the core.
 */
#include "base/parse.h"

#include <errno.h>
#include <stdlib.h>

int weft__parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    if (s == NULL || *s == '\0')
        return -1;
    /* strtol reports overflow only through errno. */
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}
