/* psm-out.h — where the library's reports go (core/base/psm-out.c; part of
 * psm-pipeline.h's API, ABI 1.20) */
#ifndef PSM_OUT_H
#define PSM_OUT_H
#include <glib.h>
G_BEGIN_DECLS

/* ABI 1.20: what the library reports while it runs goes to one function,
 * which the program sets (psm-run prints results to standard output and
 * the rest to standard error); the library itself prints nothing. Kinds: a
 * result or a step of the run (a line, with its newline); a note or
 * warning; a live progress line, which the next one replaces; the end of
 * the live line. Until psm_set_output is called (or after a call with NULL)
 * results and progress go nowhere and notes to standard error. */
typedef enum { PSM_OUT_RESULT, PSM_OUT_NOTE, PSM_OUT_PROGRESS, PSM_OUT_PROGRESS_END } PsmOutKind;
typedef void (*PsmOutFn) (PsmOutKind kind, const char *text, void *user_data);
void psm_set_output (PsmOutFn fn, void *user_data);

G_END_DECLS
#endif
