/* rouge-stem — ROUGE-1.5.5's MorphStem: a token is looked up in WordNet
 * 2.0's exception table and, when it is not there, stemmed with the
 * script's Porter stemmer.  Internal to the rouge metric plugin. */
#pragma once
#include <glib.h>

typedef struct {
  const char *word, *base;
} RougeException;

/* WordNet 2.0's exceptions as the script's database holds them, sorted by
 * strcmp (generated at build time by rouge-exceptions.sh). */
extern const RougeException rouge_exceptions[];
extern const unsigned rouge_n_exceptions;

typedef struct RougeStemmer RougeStemmer;

/* exceptions: FALSE stems every token (the script with an empty database). */
RougeStemmer *rouge_stemmer_new (gboolean exceptions, GError **error);
void rouge_stemmer_free (RougeStemmer *s);

/* The base form of exception-table word w, or NULL. */
const char *rouge_exception (const char *w);

/* w (lower case) replaced by what MorphStem returns for it. */
void rouge_stem (const RougeStemmer *s, GString *w);
