/* psm-tools.h — the sub-commands of psm-run beside the pipelines: view
 * (an HTML page of decoded examples), plot (learning curves as SVG), serve
 * (an HTTP summariser) and convert (CNN/DailyMail datasets as the cnndm
 * task's jsonl). Each parses its own options and returns the exit status:
 * 0 ok, 1 runtime error, 2 usage error. */
#ifndef PSM_TOOLS_H
#define PSM_TOOLS_H
#include <glib.h>
#include "psm/psm-pipeline.h"

int psm_view_main (int argc, char **argv);
int psm_plot_main (int argc, char **argv);
int psm_serve_main (int argc, char **argv);
int psm_convert_main (int argc, char **argv);
/* psm-run convert's reading of one input, format "see-bin", "jsonl" or
 * "csv" (name: for messages), its records written to out as the cnndm
 * task's jsonl (tokenised as --tokenize auto); *records: how many. */
gboolean psm_convert_stream (FILE *in, const char *name, const char *format, FILE *out, long *records,
                             GError **error);

/* The viewer page (tools/view.html, compiled in) with data, a JSON object
 * ({"title", "mode": "file" | "serve", "summary", "examples": [...]}),
 * put into its data element; '<' is escaped so no text ends the script. */
char *psm_view_page (const char *data_json, GError **error);
/* Parses a sub-command's options (psm-run NAME ...); FALSE after printing
 * "psm-run NAME: what is wrong (try psm-run NAME --help)". */
gboolean psm_tool_options (const char *name, const char *params, const char *description, GOptionEntry *entries,
                           int *argc, char ***argv);
/* A JSON string literal of s (quotes included) appended to out. */
void psm_json_string (GString *out, const char *s);
/* {"error": MESSAGE} and a newline: the body of psm-run serve's error answers. */
char *psm_json_error (const char *message);
/* Per-example ROUGE-1/2/L F1 (%) of a decoded record, with the rouge metric
 * plugin; NULL if the plugin is not found (with a warning once). The
 * returned object text is appended to out as ", \"rouge\": {...}". */
typedef struct PsmRougeScorer PsmRougeScorer;
PsmRougeScorer *psm_rouge_scorer_new (void);
void psm_rouge_scorer_free (PsmRougeScorer *r);
gboolean psm_rouge_scorer_score (PsmRougeScorer *r, const char *hyp, const char *ref, const char *src, double f[3]);
/* A decoded record (one --json line) for the page: checked for what the
 * page reads (tokens and source: strings; where present p_gen, copied,
 * attention_weights (one list per token), coverage and importance (one
 * value per source token), reference (a string)), then the line with
 * ", \"rouge\": {...}" added when it has a reference and r is not NULL,
 * the F1s accumulated into sum[3], *n. NULL with why if it is no record. */
char *psm_view_record (const char *line, PsmRougeScorer *r, double sum[3], int *n, char **why);
/* Past the first JSON value of text[0..len) (after blanks), by its
 * lexical shape alone: an object or array to its matching bracket
 * (strings and their escapes skipped), a string to its closing quote, a
 * number or literal to its last character; NULL when the text is blank,
 * ends inside that value or has a string escape JSON does not have.
 * json-glib 1.6 reads every value of a text, keeps the first as the root
 * and loses the others (a leak: "{...}{}" parses as its first object), so
 * each reader below refuses a text with anything after its first value
 * before json-glib sees it (psm_json_shape). */
const char *psm_json_first_value_end (const char *text, gsize len);
/* Whether text is one JSON value as far as its lexical shape shows:
 * PSM_JSON_TRAILING_TEXT when anything but blanks follows its first value,
 * PSM_JSON_BAD_ESCAPE when a string has an escape JSON does not have
 * (json-glib reads some of those differently, so where the value ends
 * would not be known), PSM_JSON_TOO_DEEP when arrays and objects nest
 * more than max_depth levels (> 0; json-glib's parser recurses once a
 * level, so a deep enough text overflows the stack: issue 58);
 * PSM_JSON_ONE_VALUE otherwise (also when the text ends inside the value:
 * json-glib then says what is wrong). psm_json_shape_message says what is
 * wrong in words. The readers' bounds: */
#define PSM_JSON_MAX_DEPTH 64     /* records psm writes (view, plot): 3 levels */
#define PSM_REQUEST_MAX_DEPTH 2   /* POST /summarize: an object of strings and numbers */
typedef enum {
  PSM_JSON_ONE_VALUE,
  PSM_JSON_TRAILING_TEXT,
  PSM_JSON_BAD_ESCAPE,
  PSM_JSON_TOO_DEEP
} PsmJsonShape;
PsmJsonShape psm_json_shape (const char *text, gsize len, int max_depth);
const char *psm_json_shape_message (PsmJsonShape shape);
/* The body of POST /summarize: text (blank-free, one line) and the decode
 * settings (defaults where absent; beam <= max_beam, lengths <= max_len,
 * min_len <= max_len). FALSE with why (g_free) naming what is wrong. */
gboolean psm_serve_parse_request (const char *body, gsize len, const PsmDecodeSettings *defaults, int max_beam,
                                  int max_len, char **text, PsmDecodeSettings *ds, char **why);
#endif
