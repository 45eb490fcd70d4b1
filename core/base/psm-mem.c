/* psm-mem.c — memory limits and what happens when memory runs out.
 *
 * Sizes that come from a pipeline (parameters, a step's activations) are
 * checked against the memory the process may use before anything is
 * allocated, and fail as configuration errors. Allocations in the middle of
 * a step cannot fail gracefully (the ops return tensors, not errors); those
 * go through psm_out_of_memory(), which calls the handler the program set
 * (psm-run prints a message and exits with status 1) or aborts. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include "base/base-internal.h"

static PsmOomHandler oom_handler;

void
psm_set_oom_handler (PsmOomHandler handler)
{
  oom_handler = handler;
}

void
psm_out_of_memory (size_t bytes, const char *what)
{
  if (oom_handler)
    oom_handler (bytes, what);
  g_error ("psm: out of memory allocating %zu bytes for %s", bytes, what);
}

/* "24G", "512M", "1000000": bytes; 0 when malformed. */
static guint64
parse_size (const char *s)
{
  char *end = NULL;
  double v = g_ascii_strtod (s, &end);
  if (end == s || !(v > 0))
    return 0;
  switch (g_ascii_toupper (*end)) {
  case 'K': v *= 1024.0; end++; break;
  case 'M': v *= 1024.0 * 1024; end++; break;
  case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
  case 'T': v *= 1024.0 * 1024 * 1024 * 1024; end++; break;
  default: break;
  }
  return *end == '\0' && v < 1.8e19 ? (guint64) v : 0;
}

guint64
psm_memory_limit (void)
{
  const char *env = g_getenv ("PSM_MEMORY_LIMIT");
  guint64 env_limit = env ? parse_size (env) : 0;
  if (env_limit)
    return env_limit;
  long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  guint64 limit = pages > 0 && page > 0 ? (guint64) pages * (guint64) page : 0;
  struct rlimit rl;
  if (getrlimit (RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (!limit || rl.rlim_cur < limit))
    limit = rl.rlim_cur;
  return limit;
}

void *
psm_xmalloc (size_t bytes, const char *what)
{
  void *p = malloc (MAX (bytes, 1));
  if (!p)
    psm_out_of_memory (bytes, what);
  return p;
}

void *
psm_xmalloc0 (size_t bytes, const char *what)
{
  void *p = calloc (MAX (bytes, 1), 1);
  if (!p)
    psm_out_of_memory (bytes, what);
  return p;
}

void *
psm_xaligned (size_t bytes, const char *what)
{
  void *p = NULL;
  if (posix_memalign (&p, 64, MAX ((bytes + 63) & ~(size_t) 63, 64)) != 0)
    psm_out_of_memory (bytes, what);
  return p;
}
