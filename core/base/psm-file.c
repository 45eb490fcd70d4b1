/* psm-file.c — opening files in a run folder without following links.
 *
 * A run folder is written by psm and may be readable by others; a symbolic
 * link planted there (log.jsonl -> a file of the user's) must not make a
 * training run write through it (issue 58). Files psm writes in place are
 * opened with O_NOFOLLOW; files replaced atomically are written to a
 * temporary file of an unpredictable name (mkstemp: created, never opened
 * if it exists) and renamed over their path, which replaces a link rather
 * than writing through it. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "base/base-internal.h"

FILE *
psm_fopen_nofollow (const char *path, const char *mode)
{
  int flags = O_CLOEXEC | O_NOFOLLOW;
  if (mode[0] == 'r')
    flags |= mode[1] == '+' ? O_RDWR : O_RDONLY;
  else if (mode[0] == 'a')
    flags |= O_WRONLY | O_CREAT | O_APPEND;
  else
    flags |= O_WRONLY | O_CREAT | O_TRUNC;
  int fd = open (path, flags, 0666);   /* a link: ELOOP */
  if (fd < 0)
    return NULL;
  FILE *f = fdopen (fd, mode);
  if (!f) {
    int e = errno;
    close (fd);
    errno = e;
  }
  return f;
}

FILE *
psm_fopen_temp (const char *path, char **tmp)
{
  *tmp = g_strconcat (path, ".tmp.XXXXXX", NULL);
  int fd = g_mkstemp_full (*tmp, O_RDWR | O_CLOEXEC, 0666);   /* O_EXCL; the umask applies to 0666 */
  if (fd < 0)
    return NULL;
  FILE *f = fdopen (fd, "wb");
  if (!f) {
    int e = errno;
    close (fd);
    g_unlink (*tmp);
    errno = e;
  }
  return f;
}

const char *
psm_file_error (int e)
{
  return e == ELOOP ? "is a symbolic link (psm does not write through links in a run folder)" : g_strerror (e);
}
