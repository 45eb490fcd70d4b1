/* psm-plugin.c — the loader: open, find the entry symbol, check the
 * descriptor, call init, never unload. Every failure names the file. */
#include "config.h"
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>
#include "config/config-internal.h"

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

/* Every hook of each kind's class; the required ones (called
 * unconditionally by the core) first. */
typedef struct {
  size_t offset;
  const char *name;
  gboolean required;
} Hook;
#define HOOK(type, field) { offsetof (type, field), #field, TRUE }
#define OPT(type, field) { offsetof (type, field), #field, FALSE }
static const Hook encoder_hooks[] = {
  HOOK (PsmEncoderClass, create), HOOK (PsmEncoderClass, destroy), HOOK (PsmEncoderClass, output_dim),
  HOOK (PsmEncoderClass, summary_dim), HOOK (PsmEncoderClass, encode), OPT (PsmEncoderClass, carry_dim),
  { 0, NULL, FALSE }
};
static const Hook decoder_hooks[] = {
  HOOK (PsmDecoderClass, create), HOOK (PsmDecoderClass, destroy), HOOK (PsmDecoderClass, state_dim),
  HOOK (PsmDecoderClass, context_dim), HOOK (PsmDecoderClass, has_attention), HOOK (PsmDecoderClass, init),
  HOOK (PsmDecoderClass, step), OPT (PsmDecoderClass, prepare), { 0, NULL, FALSE }
};
static const Hook head_hooks[] = {
  HOOK (PsmHeadClass, create), HOOK (PsmHeadClass, destroy), HOOK (PsmHeadClass, loss),
  HOOK (PsmHeadClass, space_size), HOOK (PsmHeadClass, scores), HOOK (PsmHeadClass, slot_token),
  OPT (PsmHeadClass, gate), OPT (PsmHeadClass, history), OPT (PsmHeadClass, token_logp),
  OPT (PsmHeadClass, input_embed), { 0, NULL, FALSE }
};
static const Hook task_hooks[] = {
  HOOK (PsmTaskClass, create), HOOK (PsmTaskClass, destroy), HOOK (PsmTaskClass, info),
  OPT (PsmTaskClass, train_batch), HOOK (PsmTaskClass, n_examples), OPT (PsmTaskClass, eval_batch),
  HOOK (PsmTaskClass, token_text), OPT (PsmTaskClass, save), OPT (PsmTaskClass, text_batch),
  OPT (PsmTaskClass, example_text), OPT (PsmTaskClass, train_cursor), OPT (PsmTaskClass, train_seek),
  OPT (PsmTaskClass, source_length), OPT (PsmTaskClass, eval_batch_of), { 0, NULL, FALSE }
};
static const Hook metric_hooks[] = {
  HOOK (PsmMetricClass, create), HOOK (PsmMetricClass, destroy), HOOK (PsmMetricClass, reset),
  HOOK (PsmMetricClass, report), OPT (PsmMetricClass, add), OPT (PsmMetricClass, add_loss),
  OPT (PsmMetricClass, add_text), { 0, NULL, FALSE }
};
static const Hook *const kind_hooks[] = { NULL, encoder_hooks, decoder_hooks, head_hooks, task_hooks,
                                          metric_hooks };

/* A hook past the end of the plugin's class (built for an older minor
 * ABI) counts as NULL, as PSM_CLASS_HOOK says. */
static gboolean
hook_set (const void *klass, size_t offset)
{
  guint32 size;
  memcpy (&size, klass, sizeof size);
  void (*fn) (void);
  if (size < offset + sizeof fn)
    return FALSE;
  memcpy (&fn, (const char *) klass + offset, sizeof fn);
  return fn != NULL;
}

int
psm_plugin_hooks (const PsmPlugin *pl, PsmHookInfo *out, int max)
{
  int n = 0;
  for (const Hook *h = kind_hooks[pl->desc->kind]; h->name; h++, n++)
    if (n < max)
      out[n] = (PsmHookInfo) { h->name, h->required, hook_set (pl->desc->klass, h->offset) };
  return n;
}

/* Every hook the core calls is set; a metric takes pairs or losses. */
static gboolean
check_class (const char *path, const PsmPluginDesc *d, GError **error)
{
  const char *kname = psm_kind_name (d->kind);
  for (const Hook *h = kind_hooks[d->kind]; h->name; h++)
    if (h->required && !hook_set (d->klass, h->offset)) {
      g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_CLASS,
                   "%s: %s plugin '%s': required class field '%s' is NULL", path, kname, d->name, h->name);
      return FALSE;
    }
  /* a task without train_batch or eval_batch has them made from eval_batch_of (ABI 1.20) */
  if (d->kind == PSM_KIND_TASK && !hook_set (d->klass, offsetof (PsmTaskClass, eval_batch_of)))
    for (int i = 0; i < 2; i++)
      if (!hook_set (d->klass, i ? offsetof (PsmTaskClass, eval_batch) : offsetof (PsmTaskClass, train_batch))) {
        g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_CLASS,
                     "%s: task plugin '%s': class fields '%s' and 'eval_batch_of' are both NULL (one is required)",
                     path, d->name, i ? "eval_batch" : "train_batch");
        return FALSE;
      }
  if (d->kind == PSM_KIND_METRIC && !hook_set (d->klass, offsetof (PsmMetricClass, add)) &&
      !hook_set (d->klass, offsetof (PsmMetricClass, add_loss)) &&
      !PSM_CLASS_HOOK ((const PsmMetricClass *) d->klass, add_text)) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_CLASS,
                 "%s: metric plugin '%s': class fields 'add', 'add_loss' and 'add_text' are all NULL (one is required)",
                 path, d->name);
    return FALSE;
  }
  return TRUE;
}

static gboolean
default_ok (const PsmParamSpec *p)
{
  char *end = NULL;
  switch (p->type) {
  case PSM_PARAM_INT: {
    gint64 v = g_ascii_strtoll (p->def, &end, 10);
    return *p->def && *end == '\0' && (p->min > p->max || (v >= p->min && v <= p->max));
  }
  case PSM_PARAM_FLOAT: {
    double v = g_ascii_strtod (p->def, &end);
    return *p->def && *end == '\0' && (p->min > p->max || (v >= p->min && v <= p->max));
  }
  case PSM_PARAM_BOOL:
    return strcmp (p->def, "true") == 0 || strcmp (p->def, "false") == 0;
  case PSM_PARAM_CHOICE: {
    char **c = g_strsplit (p->choices, "|", -1);
    gboolean ok = g_strv_contains ((const char *const *) c, p->def);
    g_strfreev (c);
    return ok;
  }
  default:
    return TRUE;
  }
}

/* The parameter table drives validation, --list and the man page: a
 * malformed entry is the plugin's bug, refused at load. */
static gboolean
check_params (const char *path, const PsmPluginDesc *d, GError **error)
{
  const char *why = NULL;
  const PsmParamSpec *p = d->params;
  for (int i = 0; p && p->name; p++, i++) {
    if (i >= 1024)
      why = "has no PSM_PARAM_END within 1024 entries";
    else if (!*p->name)
      why = "has an empty name";
    else if ((int) p->type < PSM_PARAM_INT || p->type > PSM_PARAM_FILE)
      why = "has an unknown type";
    else if (p->type == PSM_PARAM_CHOICE && (!p->choices || !*p->choices))
      why = "is a choice with no choices";
    else if (!p->doc)
      why = "has no documentation line";
    else if (p->def && !default_ok (p))
      why = "has a default that is not a valid value";
    for (const PsmParamSpec *q = d->params; !why && q < p; q++)
      if (strcmp (q->name, p->name) == 0)
        why = "is declared twice";
    if (why) {
      g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_CLASS, "%s: %s plugin '%s': parameter '%s' %s",
                   path, psm_kind_name (d->kind), d->name, p->name, why);
      return FALSE;
    }
  }
  return TRUE;
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

/* A plugin's name: 1 to 64 of [a-z0-9_], so that a name from a pipeline
 * cannot leave the plugin folders ("x/../../evil"; issue 58). */
static gboolean
valid_name (const char *name)
{
  size_t n = strspn (name, "abcdefghijklmnopqrstuvwxyz0123456789_");
  return n > 0 && n <= 64 && name[n] == '\0';
}

/* Whether d is not the plugin a file's name asks for (want_name NULL:
 * any), with the error said. */
static gboolean
other_name (const char *path, PsmKind want_kind, const char *want_name, const PsmPluginDesc *d, GError **error)
{
  if (!want_name || (d->kind == want_kind && strcmp (d->name, want_name) == 0))
    return FALSE;
  g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_KIND, "%s: file is named for %s '%s' but the plugin is %s '%s'",
               path, psm_kind_name (want_kind), want_name, psm_kind_name (d->kind), d->name);
  return TRUE;
}

/* The plugin at path; with want_name, it must be the plugin of that kind
 * and name, checked before its init runs. */
static const PsmPlugin *
load_locked (const char *path, PsmKind want_kind, const char *want_name, GError **error)
{
  if (!by_path) {
    by_path = g_hash_table_new (g_str_hash, g_str_equal);
    by_name = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  }
  PsmPlugin *known = g_hash_table_lookup (by_path, path);
  if (known)
    return other_name (path, want_kind, want_name, known->desc, error) ? NULL : known;

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
  if (!kname || !d->name || !valid_name (d->name) || !d->klass) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_KIND,
                 "%s: invalid descriptor (kind %d, name %s, %s; names are 1 to 64 of a-z, 0-9 and _)", path,
                 (int) d->kind, d->name ? d->name : "(null)", d->klass ? "class set" : "no class");
    dlclose (h);
    return NULL;
  }
  if (other_name (path, want_kind, want_name, d, error)) {
    dlclose (h);
    return NULL;
  }
  /* The class struct starts with its size; it must cover every hook of
   * ABI 1.0 (hooks appended since are optional: the core reads them only
   * when the size covers them, PSM_CLASS_HOOK). */
  static const guint32 class_sizes[] = { 0, sizeof (PsmEncoderClass), offsetof (PsmDecoderClass, prepare),
                                         offsetof (PsmHeadClass, gate), offsetof (PsmTaskClass, save),
                                         offsetof (PsmMetricClass, add_text) };
  guint32 csize = *(const guint32 *) d->klass;
  if (csize < class_sizes[d->kind]) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_ABI,
                 "%s: %s class is %u bytes, this psm needs %u (rebuild the plugin)", path, kname,
                 csize, class_sizes[d->kind]);
    dlclose (h);
    return NULL;
  }
  if (!check_class (path, d, error) || !check_params (path, d, error)) {
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
  const PsmPlugin *pl = load_locked (path, 0, NULL, error);
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
  if (!valid_name (name)) {
    g_set_error (error, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_NOT_FOUND,
                 "invalid %s plugin name '%s': a name is 1 to 64 of a-z, 0-9 and _ (see psm-run --list)",
                 psm_kind_name (kind), name);
    return NULL;
  }
  char *base = file_name (kind, name);
  const char *const *dirs = psm_plugin_path ();
  for (const char *const *d = dirs; *d; d++) {
    char *path = g_build_filename (*d, base, NULL);
    if (g_file_test (path, G_FILE_TEST_EXISTS)) {
      g_mutex_lock (&lock);
      const PsmPlugin *pl = load_locked (path, kind, name, error);
      g_mutex_unlock (&lock);
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
