/* headline-text.h — the headline task's text handling (headline-text.c). */
#ifndef HEADLINE_TEXT_H
#define HEADLINE_TEXT_H
#include <glib.h>

/* The tokens of a text (GPtrArray of strings) split on white space; with
 * gigaword in Rush et al.'s form (digits as #, brackets as -lrb- ...; with
 * entity the word|TAG tokens keep their tag), and a title loses a final ".". */
GPtrArray *headline_tokens (const char *text, gboolean gigaword, gboolean entity, gboolean title);
/* Entity anonymisation of one document in place: word|TAG (TAG not O)
 * becomes @entity<k>, k by first appearance of the word over source then
 * title; other tokens lose any |O. */
void headline_anonymise (GPtrArray *src, GPtrArray *tgt);
/* The tokens joined by single spaces (a new string). */
char *headline_join (GPtrArray *w);
/* . ! or ? */
gboolean headline_ends_sentence (const char *w);
/* The first n sentences of a tokenised text: up to and including the n-th
 * . ! or ? token (all of it if there are fewer). */
char *headline_lead (const char *text, int n);

#endif
