/* psm-plugin.c — the loader: open, find the entry symbol, check the
 * descriptor, call init, never unload. Every failure names the file. */
#include "config.h"
#include <dlfcn.h>
#include <string.h>
#include "psm-private.h"

G_DEFINE_QUARK (psm-plugin-error-quark, psm_plugin_error)

static const char *const kind_names[] = { NULL, "encoder", "decoder", "head", "task", "metric" };

const char *
psm_kind_name (PsmKind kind)
{
  return kind >= PSM_KIND_ENCODER && kind <= PSM_KIND_LAST ? kind_names[kind] : NULL;
}

gboolean
psm_kind_from_name (const char *name, PsmKind *kind)
{
  for (int k = PSM_KIND_ENCODER; k <= PSM_KIND_LAST; k++)
    if (strcmp (name, kind_names[k]) == 0) {
      *kind = (PsmKind) k;
      return TRUE;
    }
  return FALSE;
}

static GMutex lock;
static GHashTable *by_path;   /* path -> PsmPlugin* */
static GHashTable *by_name;   /* "kind/name" -> PsmPlugin* */
static char **search_path;

const char *const *
psm_plugin_path (void)
{
  g_mutex_lock (&lock);
  if (!search_path) {
    GPtrArray *a = g_ptr_array_new ();
    const char *env = g_getenv ("PSM_PLUGIN_PATH");
    if (env) {
      char **parts = g_strsplit (env, G_SEARCHPATH_SEPARATOR_S, -1);
      for (char **p = parts; *p; p++)
        if (**p)
          g_ptr_array_add (a, g_strdup (*p));
      g_strfreev (parts);
    }
    g_ptr_array_add (a, g_strdup (PSM_PLUGINDIR));
    g_ptr_array_add (a, NULL);
    search_path = (char **) g_ptr_array_free (a, FALSE);
  }
  g_mutex_unlock (&lock);
  return (const char *const *) search_path;
}

static const PsmPlugin *
load_locked (const char *path, GError **error)
{
  if (!by_path) {
    by_path = g_hash_table_new (g_str_hash, g_str_equal);
    by_name = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  }
  PsmPlugin *known = g_hash_table_lookup (by_path, path);
  if (known)
    return known;

  void *h = dlopen (path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_OPEN, "%s: cannot load plugin: %s", path,
                 dlerror ());
    return NULL;
  }
  PsmPluginEntry entry = (PsmPluginEntry) dlsym (h, PSM_PLUGIN_ENTRY_SYMBOL);
  if (!entry) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_NO_ENTRY,
                 "%s: not a psm plugin (no symbol %s)", path, PSM_PLUGIN_ENTRY_SYMBOL);
    dlclose (h);
    return NULL;
  }
  const PsmPluginDesc *d = entry ();
  if (!d || d->struct_size < sizeof (PsmPluginDesc)) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_ABI,
                 "%s: plugin descriptor is %u bytes, this psm needs at least %zu (rebuild the plugin against psm %s)",
                 path, d ? d->struct_size : 0, sizeof (PsmPluginDesc), PACKAGE_VERSION);
    dlclose (h);
    return NULL;
  }
  if (d->abi_major != PSM_ABI_MAJOR || d->abi_minor > PSM_ABI_MINOR) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_ABI,
                 "%s: plugin ABI %u.%u is incompatible with this psm's ABI %d.%d (same major, minor not newer)",
                 path, d->abi_major, d->abi_minor, PSM_ABI_MAJOR, PSM_ABI_MINOR);
    dlclose (h);
    return NULL;
  }
  const char *kname = psm_kind_name (d->kind);
  if (!kname || !d->name || !*d->name || !d->klass) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_KIND,
                 "%s: invalid descriptor (kind %d, name %s, %s)", path, (int) d->kind,
                 d->name ? d->name : "(null)", d->klass ? "class set" : "no class");
    dlclose (h);
    return NULL;
  }
  /* The class struct starts with its size; it must cover this psm's. */
  static const guint32 class_sizes[] = { 0, sizeof (PsmEncoderClass), sizeof (PsmDecoderClass),
                                         sizeof (PsmHeadClass), sizeof (PsmTaskClass),
                                         sizeof (PsmMetricClass) };
  guint32 csize = *(const guint32 *) d->klass;
  if (csize < class_sizes[d->kind]) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_ABI,
                 "%s: %s class is %u bytes, this psm needs %u (rebuild the plugin)", path, kname,
                 csize, class_sizes[d->kind]);
    dlclose (h);
    return NULL;
  }
  char *key = g_strdup_printf ("%s/%s", kname, d->name);
  PsmPlugin *other = g_hash_table_lookup (by_name, key);
  if (other) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_DUPLICATE,
                 "%s: %s plugin '%s' is already loaded from %s", path, kname, d->name, other->path);
    g_free (key);
    dlclose (h);
    return NULL;
  }
  GError *ierr = NULL;
  if (d->init && !d->init (&ierr)) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_INIT, "%s: plugin init failed: %s", path,
                 ierr ? ierr->message : "no reason given");
    g_clear_error (&ierr);
    g_free (key);
    dlclose (h);
    return NULL;
  }
  PsmPlugin *pl = g_new0 (PsmPlugin, 1);
  pl->desc = d;
  pl->path = g_strdup (path);
  g_hash_table_insert (by_path, pl->path, pl);
  g_hash_table_insert (by_name, key, pl);
  return pl;   /* never unloaded: pointers into it live until exit */
}

const PsmPlugin *
psm_plugin_load_file (const char *path, GError **error)
{
  g_mutex_lock (&lock);
  const PsmPlugin *pl = load_locked (path, error);
  g_mutex_unlock (&lock);
  return pl;
}

static char *
file_name (PsmKind kind, const char *name)
{
  return g_strdup_printf ("psm-%s-%s.so", psm_kind_name (kind), name);
}

const PsmPlugin *
psm_plugin_find (PsmKind kind, const char *name, GError **error)
{
  g_return_val_if_fail (psm_kind_name (kind), NULL);
  char *base = file_name (kind, name);
  const char *const *dirs = psm_plugin_path ();
  for (const char *const *d = dirs; *d; d++) {
    char *path = g_build_filename (*d, base, NULL);
    if (g_file_test (path, G_FILE_TEST_EXISTS)) {
      const PsmPlugin *pl = psm_plugin_load_file (path, error);
      if (pl && (pl->desc->kind != kind || strcmp (pl->desc->name, name) != 0)) {
        g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_KIND,
                     "%s: file is named for %s '%s' but the plugin is %s '%s'", path,
                     psm_kind_name (kind), name, psm_kind_name (pl->desc->kind), pl->desc->name);
        pl = NULL;
      }
      g_free (path);
      g_free (base);
      return pl;
    }
    g_free (path);
  }
  char *joined = g_strjoinv (G_SEARCHPATH_SEPARATOR_S, (char **) dirs);
  g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_NOT_FOUND,
               "no %s plugin named '%s' (looked for %s in %s; see psm-run --list)",
               psm_kind_name (kind), name, base, joined);
  g_free (joined);
  g_free (base);
  return NULL;
}

static gint
cmp_plugins (gconstpointer a, gconstpointer b)
{
  const PsmPlugin *x = *(const PsmPlugin *const *) a, *y = *(const PsmPlugin *const *) b;
  if (x->desc->kind != y->desc->kind)
    return (int) x->desc->kind - (int) y->desc->kind;
  return strcmp (x->desc->name, y->desc->name);
}

GPtrArray *
psm_plugin_load_all (GPtrArray *errors)
{
  GPtrArray *out = g_ptr_array_new ();
  GHashTable *seen = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  for (const char *const *d = psm_plugin_path (); *d; d++) {
    GDir *dir = g_dir_open (*d, 0, NULL);
    if (!dir)
      continue;
    GPtrArray *names = g_ptr_array_new_with_free_func (g_free);
    const char *f;
    while ((f = g_dir_read_name (dir)))
      if (g_str_has_prefix (f, "psm-") && g_str_has_suffix (f, ".so"))
        g_ptr_array_add (names, g_strdup (f));
    g_dir_close (dir);
    g_ptr_array_sort (names, (GCompareFunc) g_strcmp0);
    for (guint i = 0; i < names->len; i++) {
      const char *base = g_ptr_array_index (names, i);
      if (g_hash_table_contains (seen, base))
        continue;   /* shadowed by an earlier directory */
      g_hash_table_add (seen, g_strdup (base));
      char *path = g_build_filename (*d, base, NULL);
      GError *err = NULL;
      const PsmPlugin *pl = psm_plugin_load_file (path, &err);
      if (pl)
        g_ptr_array_add (out, (gpointer) pl);
      else if (errors)
        g_ptr_array_add (errors, g_strdup (err->message));
      g_clear_error (&err);
      g_free (path);
    }
    g_ptr_array_unref (names);
  }
  g_hash_table_destroy (seen);
  g_ptr_array_sort (out, cmp_plugins);
  return out;
}
