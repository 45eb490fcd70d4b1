/* psm-out.c — where the library's reports go (psm_set_output): one
 * function set by the program; the library prints nothing itself. */
#include "config.h"
#include <stdarg.h>
#include <stdio.h>
#include "base/base-internal.h"
#include "psm/psm-pipeline.h"

static PsmOutFn out_fn;
static void *out_data;

void
psm_set_output (PsmOutFn fn, void *user_data)
{
  out_fn = fn;
  out_data = user_data;
}

void
psm_out (PsmOutKind kind, const char *fmt, ...)
{
  if (!out_fn && kind != PSM_OUT_NOTE)
    return;
  va_list ap;
  va_start (ap, fmt);
  char *text = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  if (out_fn)
    out_fn (kind, text, out_data);
  else
    fputs (text, stderr);
  g_free (text);
}
