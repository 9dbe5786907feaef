/*
 * Reading numbers from text: the one integer parser shared by the library
 * (its WEFT_* environment variables, src/topo/config.c) and weftrun (its
 * option values, launcher/args.c).
 *
 * This header includes nothing of the library's, so that weftrun, which is
 * built from its own sources and not against libweft, can use it without
 * depending on the library's internals.
 */
#ifndef WEFT_PARSE_H
#define WEFT_PARSE_H

/* Parses all of s as a decimal integer in [lo, hi], as strtol reads one
 * (leading blanks and a sign are accepted; a caller that wants digits only
 * checks that first). Returns 0 and sets *out, or -1 where s is NULL or
 * empty, is not a number, has anything after the number, or is out of
 * range; *out is then left alone. May change errno. Never prints: each
 * caller words its own message. */
int weft__parse_long(const char *s, long lo, long hi, long *out);

#endif
