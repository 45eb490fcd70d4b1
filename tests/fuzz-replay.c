/* fuzz-replay — runs every fuzz target (fuzz/psm-fuzz.c) over its kept
 * corpus, the files in fuzz/corpus/TARGET/: the fuzzers' seeds and every input they
 * found new paths with, kept as regression inputs. Under make check (and
 * its sanitizer build) a crash or a sanitizer report fails it.
 *   fuzz-replay [CORPUS_DIR]             (default $top_srcdir/fuzz/corpus)
 *   fuzz-replay --checkpoint-seed PATH   writes a valid checkpoint seed
 *   fuzz-replay --stream-state-seed PATH writes a valid training-stream state */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glib.h>
#include "../fuzz/psm-fuzz.h"

int
main (int argc, char **argv)
{
  if (argc == 3 && strcmp (argv[1], "--checkpoint-seed") == 0) {
    psm_fuzz_write_checkpoint_seed (argv[2]);
    return 0;
  }
  if (argc == 3 && strcmp (argv[1], "--stream-state-seed") == 0) {
    psm_fuzz_write_stream_state_seed (argv[2]);
    return 0;
  }
  if (!g_getenv ("PSM_PLUGIN_PATH") && g_getenv ("top_builddir")) {
    char *p = g_build_filename (g_getenv ("top_builddir"), "plugins", ".libs", NULL);
    g_setenv ("PSM_PLUGIN_PATH", p, TRUE);
    g_free (p);
  }
  char *root = argc > 1 ? g_strdup (argv[1])
                        : g_build_filename (g_getenv ("top_srcdir") ? g_getenv ("top_srcdir") : ".", "fuzz", "corpus",
                                            NULL);
  int n = 0, bad = 0;
  for (const PsmFuzzTarget *t = psm_fuzz_targets; t->name; t++) {
    char *d = g_build_filename (root, t->name, NULL);
    GDir *dir = g_dir_open (d, 0, NULL);
    const char *name;
    GPtrArray *files = g_ptr_array_new_with_free_func (g_free);
    while (dir && (name = g_dir_read_name (dir)))
      g_ptr_array_add (files, g_build_filename (d, name, NULL));
    if (dir)
      g_dir_close (dir);
    n++;
    if (files->len == 0) {
      printf ("not ok %d - %s: no corpus in %s\n", n, t->name, d);
      bad++;
    } else {
      for (guint i = 0; i < files->len; i++) {
        char *data = NULL;
        gsize len = 0;
        if (!g_file_get_contents (files->pdata[i], &data, &len, NULL))
          continue;
        t->run ((const uint8_t *) data, len);
        g_free (data);
      }
      printf ("ok %d - %s: %u inputs replayed without a crash\n", n, t->name, files->len);
    }
    g_ptr_array_unref (files);
    g_free (d);
  }
  printf ("1..%d\n", n);
  g_free (root);
  return bad ? 1 : 0;
}
