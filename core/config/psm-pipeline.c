/* psm-pipeline.c — reads a pipeline file, applies --set, resolves plugins
 * and validates every section against its declared table, reporting every
 * problem at once as FILE:LINE: key.path: what is wrong (expected). */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "config/config-internal.h"
#include "psm/psm-pipeline.h"

static const PsmParamSpec embedding_spec[] = {
  { "dim", PSM_PARAM_INT, "128", 1, 16384, "token embedding size", NULL },
  { "init_scale", PSM_PARAM_FLOAT, "0.1", 0, 10, "embeddings start U(-s, s)", NULL },
  { "tie", PSM_PARAM_BOOL, "false", PSM_NO_RANGE, "decoder inputs use the source table (equal vocabularies)", NULL },
  PSM_PARAM_END
};

static const PsmParamSpec train_spec[] = {
  { "batch", PSM_PARAM_INT, "32", 1, 65536, "examples per training step", NULL },
  { "steps", PSM_PARAM_INT, "1000", 1, PSM_MAX_STEPS, "training steps (updates)", NULL },
  { "seed", PSM_PARAM_INT, "1", 0, 2147483647, "seed of initialisation and batches", NULL },
  { "clip_norm", PSM_PARAM_FLOAT, "0", 0, 1e9, "global gradient-norm clip (0 = off)", NULL },
  { "eval_every", PSM_PARAM_INT, "1000", 1, 1e9, "validate (and checkpoint) every N steps", NULL },
  { "log_every", PSM_PARAM_INT, "100", 1, 1e9, "log line / JSON record every N steps", NULL },
  { "valid_examples", PSM_PARAM_INT, "0", 0, 1e9, "validate on the first N examples (0 = all)", NULL },
  { "init_uniform", PSM_PARAM_FLOAT, "0", 0, 10,
    "every weight U(-x, x) and every bias init_bias instead of the plugins' own init (Zeng et al.: sqrt(3/d)); 0 = off",
    NULL },
  { "init_bias", PSM_PARAM_FLOAT, "0.1", -10, 10, "biases' start with init_uniform (Zeng et al.: 0.1)", NULL },
  { "patience", PSM_PARAM_INT, "0", 0, 1e9, "stop after N validations in a row without a new best (0 = never)", NULL },
  { "checkpoint_every", PSM_PARAM_INT, "0", 0, 1e9,
    "also write last.ckpt every N updates (0 = at validations only; always at step 0 and when stopped)", NULL },
  { "on_nonfinite", PSM_PARAM_CHOICE, "stop", PSM_NO_RANGE,
    "a NaN/Inf loss or gradient: stop, skip the update, or roll back to last.ckpt with a lower lr",
    "stop|skip|rollback" },
  { "nonfinite_max", PSM_PARAM_INT, "5", 0, 1e9, "skips or rollbacks before training stops anyway", NULL },
  { "rollback_lr_factor", PSM_PARAM_FLOAT, "0.5", 0.001, 1, "learning rate times this at each rollback", NULL },
  { "dist_shard", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "over MPI ranks: each rank updates its own 1/n of the parameters (gradients reduce-scattered, parameters "
    "all-gathered) instead of every rank updating all of them", NULL },
  { "dist_overlap", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "over MPI ranks: reduce the gradients in buckets while the backward pass runs, each as soon as it is complete",
    NULL },
  { "dist_bucket_mb", PSM_PARAM_FLOAT, "4", 0.001, 1024, "over MPI ranks: megabytes of gradient a bucket", NULL },
  { "precision", PSM_PARAM_CHOICE, "fp32", PSM_NO_RANGE,
    "training's linear products, forward and backward: fp32, or bf16 (operands rounded to bfloat16, sums, "
    "gradients and weights in single precision; on AMX tiles where the CPU has them)", "fp32|bf16" },
  PSM_PARAM_END
};

static const PsmParamSpec optimizer_spec[] = {
  { "name", PSM_PARAM_CHOICE, "adam", PSM_NO_RANGE, "update rule", "sgd|adam|adagrad|adadelta" },
  { "lr", PSM_PARAM_FLOAT, "0.001", 0, 1000, "learning rate", NULL },
  { "beta1", PSM_PARAM_FLOAT, "0.9", 0, 0.999999, "adam: first-moment decay", NULL },
  { "beta2", PSM_PARAM_FLOAT, "0.999", 0, 0.999999, "adam: second-moment decay", NULL },
  { "eps", PSM_PARAM_FLOAT, "1e-8", 0, 1, "adam/adagrad/adadelta: denominator epsilon", NULL },
  { "init_accum", PSM_PARAM_FLOAT, "0.1", 0, 1000, "adagrad: initial accumulator value", NULL },
  { "rho", PSM_PARAM_FLOAT, "0.95", 0, 0.999999, "adadelta: decay of the running averages", NULL },
  { "halve_start", PSM_PARAM_INT, "0", 0, 1e12, "sgd: first step of the halving schedule", NULL },
  { "halve_every", PSM_PARAM_INT, "0", 0, 1e12, "sgd: halve lr every N steps from halve_start (0 = never)", NULL },
  { "plateau_factor", PSM_PARAM_FLOAT, "1", 0.01, 1, "lr times this when a validation is worse than the previous (1 = off)",
    NULL },
  PSM_PARAM_END
};

static const PsmParamSpec eval_spec[] = {
  { "batch", PSM_PARAM_INT, "256", 1, 65536, "examples per evaluation batch", NULL },
  { "examples", PSM_PARAM_INT, "0", 0, 1e9, "eval/test/decode the first N examples of the split (0 = all)", NULL },
  PSM_PARAM_END
};

static const PsmParamSpec decode_spec[] = {
  { "beam", PSM_PARAM_INT, "4", 1, 256, "hypotheses kept per article (1 = greedy)", NULL },
  { "min_len", PSM_PARAM_INT, "0", 0, 4096, "fewest tokens of an output, its end counted", NULL },
  { "max_len", PSM_PARAM_INT, "100", 1, 4096, "most tokens of an output", NULL },
  { "length_penalty", PSM_PARAM_FLOAT, "1", 0, 10, "rank by log p / length^a (1: mean log p, 0: sum)", NULL },
  { "block_ngram", PSM_PARAM_INT, "0", 0, 16, "never repeat an n-gram of this length (0 = off)", NULL },
  { "no_unk", PSM_PARAM_BOOL, "false", PSM_NO_RANGE, "never emit the unknown word", NULL },
  { "attn_top", PSM_PARAM_INT, "3", 0, 64, "attention positions per token in --json output", NULL },
  { "sort", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "decode a split's articles in order of source length (outputs keep the split's order)", NULL },
  { "precision", PSM_PARAM_CHOICE, "fp32", PSM_NO_RANGE,
    "decoding's linear products (the output layer's among them): fp32, or bf16 (inputs and weights rounded to "
    "bfloat16, sums in single precision; on AMX tiles where the CPU has them)", "fp32|bf16" },
  PSM_PARAM_END
};

static const PsmParamSpec continue_spec[] = {
  { "steps", PSM_PARAM_INT, "0", 0, PSM_MAX_STEPS, "steps of a second phase after train.steps (0 = none)", NULL },
  PSM_PARAM_END
};

static const PsmParamSpec run_spec[] = {
  { "dir", PSM_PARAM_STRING, "", PSM_NO_RANGE, "run folder (default runs/<pipeline name>)", NULL },
  PSM_PARAM_END
};

static const PsmCoreSection core_sections[] = {
  { "model.embedding", "token embeddings", embedding_spec },
  { "train", "training loop", train_spec },
  { "train.optimizer", "optimiser", optimizer_spec },
  { "eval", "evaluation", eval_spec },
  { "decode", "decoding (pipelines with a decoder)", decode_spec },
  { "run", "run folder", run_spec },
  { "continue", "second training phase from the first's last checkpoint (set: its --set assignments)",
    continue_spec },
  { NULL, NULL, NULL }
};

const PsmCoreSection *psm_core_sections (void) { return core_sections; }

/* Plugin-backed sections: path, kind, required. */
static const struct {
  const char *path;
  PsmKind kind;
  gboolean required;
} plugin_sections[] = {
  { "task", PSM_KIND_TASK, TRUE },
  { "model.encoder", PSM_KIND_ENCODER, FALSE },
  { "model.decoder", PSM_KIND_DECODER, FALSE },
  { "model.head", PSM_KIND_HEAD, TRUE },
};

#define MAX_METRICS 8

struct PsmPipeline {
  char *file;
  config_t cfg;
  GHashTable *sections;   /* path -> PsmSection* */
  GHashTable *plugins;    /* path -> const PsmPlugin* */
  GPtrArray *notes;       /* char*: settings dropped after a --set plugin swap */
  int n_metrics;
  const PsmPlugin *metric[MAX_METRICS];
  PsmSection *metric_sec[MAX_METRICS];
  char *run_dir;
  char **sets;            /* the --set assignments it was loaded with */
  gboolean continued;     /* phase two (psm_pipeline_continued) */
  gboolean eval_only;     /* psm_pipeline_set_eval_only */
  gboolean text_only;     /* psm_pipeline_set_text_only */
  PsmLineMap *lines;      /* the expanded text's lines -> files and lines (psm-include.c) */
};

static void
err (GPtrArray *errors, const char *file, config_setting_t *s, const char *path, const char *msg)
{
  char *w = psm_setting_where (file, s, path);
  g_ptr_array_add (errors, g_strdup_printf ("%s: %s", w, msg));
  g_free (w);
}

static config_setting_t *
lookup (config_t *cfg, const char *path)
{
  return config_lookup (cfg, path);
}

/* Validates that a group has only the given sub-groups/keys. */
static void
check_keys (const char *file, config_setting_t *g, const char *path, const char *const *allowed,
            GPtrArray *errors)
{
  psm_validate_group (file, g, path, NULL, allowed, errors);
}

/* The plugin was swapped with --set (its setting has no source line): keys
 * of the pipeline file that the new plugin does not declare belonged to the
 * old one. Drop them with a note, so an ablation is one --set. Keys given
 * with --set themselves are kept, and validated. */
static void
drop_foreign_keys (PsmPipeline *pl, config_setting_t *g, const char *path, const PsmPlugin *plug)
{
  for (int i = config_setting_length (g) - 1; i >= 0; i--) {
    config_setting_t *m = config_setting_get_elem (g, i);
    const char *name = config_setting_name (m);
    if (strcmp (name, "plugin") == 0 || config_setting_source_line (m) == 0)
      continue;
    gboolean declared = FALSE;
    for (const PsmParamSpec *p = plug->desc->params; p && p->name; p++)
      declared = declared || strcmp (p->name, name) == 0;
    if (!declared) {
      char *w = psm_setting_where (pl->file, m, path);
      g_ptr_array_add (pl->notes, g_strdup_printf ("%s.%s: ignored: not a parameter of %s '%s' (set by --set)",
                                                   w, name, psm_kind_name (plug->desc->kind), plug->desc->name));
      g_free (w);
      config_setting_remove_elem (g, (unsigned) i);
    }
  }
}

static void
resolve_plugin_section (PsmPipeline *pl, const char *path, PsmKind kind, gboolean required,
                        GPtrArray *errors, GError **plugin_error)
{
  config_setting_t *g = lookup (&pl->cfg, path);
  if (!g) {
    if (required) {
      char *m = g_strdup_printf ("missing section (expected %s = { plugin = \"...\"; ... })", path);
      err (errors, pl->file, NULL, path, m);
      g_free (m);
    }
    return;
  }
  if (config_setting_type (g) != CONFIG_TYPE_GROUP) {
    err (errors, pl->file, g, path, "wrong type (expected a group { plugin = \"...\"; ... })");
    return;
  }
  config_setting_t *ps = config_setting_get_member (g, "plugin");
  char *ppath = g_strdup_printf ("%s.plugin", path);
  if (!ps) {
    char *m = g_strdup_printf ("missing required key (the %s plugin to use; see psm-run --list)",
                               psm_kind_name (kind));
    err (errors, pl->file, g, ppath, m);
    g_free (m);
  } else if (config_setting_type (ps) != CONFIG_TYPE_STRING) {
    err (errors, pl->file, ps, ppath, "wrong type (expected a plugin name string)");
  } else {
    const char *name = config_setting_get_string (ps);
    GError *e = NULL;
    const PsmPlugin *plug = psm_plugin_find (kind, name, &e);
    if (!plug) {
      err (errors, pl->file, ps, ppath, e->message);
      if (plugin_error && !*plugin_error && e->domain == PSM_PLUGIN_ERROR &&
          e->code != PSM_PLUGIN_ERROR_NOT_FOUND)
        *plugin_error = g_error_copy (e);
      g_clear_error (&e);
    } else {
      const char *extra[] = { "plugin", NULL };
      if (config_setting_source_line (ps) == 0)
        drop_foreign_keys (pl, g, path, plug);
      psm_validate_group (pl->file, g, path, plug->desc->params, extra, errors);
      g_hash_table_insert (pl->plugins, g_strdup (path), (gpointer) plug);
      g_hash_table_insert (pl->sections, g_strdup (path),
                           psm_section_new (plug->desc->params, g, path, pl->file));
    }
  }
  g_free (ppath);
}

/* continue.set: a list of "key.path=value" strings. */
static void
check_continue_set (PsmPipeline *pl, GPtrArray *errors)
{
  config_setting_t *l = lookup (&pl->cfg, "continue.set");
  if (!l)
    return;
  int t = config_setting_type (l);
  if (t != CONFIG_TYPE_LIST && t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_STRING) {
    err (errors, pl->file, l, "continue.set",
         "wrong type (expected a list of assignments: [ \"model.decoder.coverage=true\", ... ])");
    return;
  }
  /* one string (as --set continue.set=... makes it) is one assignment */
  int n = t == CONFIG_TYPE_STRING ? 1 : config_setting_length (l);
  for (int i = 0; i < n; i++) {
    config_setting_t *e = t == CONFIG_TYPE_STRING ? l : config_setting_get_elem (l, i);
    const char *v = config_setting_type (e) == CONFIG_TYPE_STRING ? config_setting_get_string (e) : NULL;
    if (!v || !strchr (v, '=') || *v == '=' || g_str_has_prefix (v, "continue.")) {
      char *path = g_strdup_printf ("continue.set.[%d]", i);
      err (errors, pl->file, e, path, "expected a \"key.path=value\" string outside continue.*");
      g_free (path);
    }
  }
}

static void
resolve_metrics (PsmPipeline *pl, GPtrArray *errors)
{
  config_setting_t *ms = lookup (&pl->cfg, "metrics");
  if (!ms)
    return;
  int t = config_setting_type (ms);
  if (t != CONFIG_TYPE_LIST && t != CONFIG_TYPE_ARRAY) {
    err (errors, pl->file, ms, "metrics", "wrong type (expected a list: ( \"error_rate\", ... ))");
    return;
  }
  int n = config_setting_length (ms);
  for (int i = 0; i < n; i++) {
    config_setting_t *e = config_setting_get_elem (ms, i);
    char *path = g_strdup_printf ("metrics.[%d]", i);
    const char *name = NULL;
    config_setting_t *group = NULL;
    if (config_setting_type (e) == CONFIG_TYPE_STRING) {
      name = config_setting_get_string (e);
    } else if (config_setting_type (e) == CONFIG_TYPE_GROUP &&
               config_setting_lookup_string (e, "plugin", &name)) {
      group = e;
    } else {
      err (errors, pl->file, e, path, "wrong type (expected a metric name or { plugin = \"...\"; ... })");
    }
    if (name && pl->n_metrics >= MAX_METRICS) {
      err (errors, pl->file, e, path, "too many metrics (at most 8)");
    } else if (name) {
      GError *ge = NULL;
      const PsmPlugin *plug = psm_plugin_find (PSM_KIND_METRIC, name, &ge);
      if (!plug) {
        err (errors, pl->file, e, path, ge->message);
        g_clear_error (&ge);
      } else {
        const char *extra[] = { "plugin", NULL };
        if (group)
          psm_validate_group (pl->file, group, path, plug->desc->params, extra, errors);
        pl->metric[pl->n_metrics] = plug;
        pl->metric_sec[pl->n_metrics] = psm_section_new (plug->desc->params, group, path, pl->file);
        pl->n_metrics++;
      }
    }
    g_free (path);
  }
}

PsmPipeline *
psm_pipeline_load (const char *file, const char *const *sets, GError **error)
{
  PsmPipeline *pl = g_new0 (PsmPipeline, 1);
  pl->file = g_strdup (file);
  pl->sections = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, (GDestroyNotify) psm_section_free);
  pl->plugins = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  pl->notes = g_ptr_array_new_with_free_func (g_free);
  pl->sets = g_strdupv ((char **) sets);
  config_init (&pl->cfg);

  if (!g_file_test (file, G_FILE_TEST_IS_REGULAR)) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s: cannot read pipeline: %s", file,
                 g_file_test (file, G_FILE_TEST_IS_DIR) ? "is a directory, not a pipeline file"
                 : g_file_test (file, G_FILE_TEST_EXISTS) ? "not a regular file"
                                                          : "no such file");
    psm_pipeline_free (pl);
    return NULL;
  }
  /* @include paths are relative to the including file: psm expands them */
  char *text = psm_config_expand (file, &pl->lines, error);
  if (!text) {
    psm_pipeline_free (pl);
    return NULL;
  }
  if (!config_read_string (&pl->cfg, text)) {
    const char *ef = file;
    int el = config_error_line (&pl->cfg);
    psm_line_map_where (pl->lines, el, &ef, &el);
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s:%d: parse error: %s", ef, el,
                 config_error_text (&pl->cfg));
    g_free (text);
    psm_pipeline_free (pl);
    return NULL;
  }
  config_setting_set_hook (config_root_setting (&pl->cfg), pl->lines);   /* psm_setting_where reads it */
  /* Integer literals libconfig wrapped to 32 bits: the values it holds are
   * wrong, so stop before validating them (the same expanded text). */
  GPtrArray *wrapped = g_ptr_array_new_with_free_func (g_free);
  psm_config_scan_integers (file, text, pl->lines, wrapped);
  g_free (text);
  if (wrapped->len) {
    g_ptr_array_add (wrapped, NULL);
    char *msg = g_strjoinv ("\n", (char **) wrapped->pdata);
    g_set_error_literal (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, msg);
    g_free (msg);
    g_ptr_array_unref (wrapped);
    psm_pipeline_free (pl);
    return NULL;
  }
  g_ptr_array_unref (wrapped);
  for (const char *const *s = sets; s && *s; s++)
    if (!psm_config_apply_set (&pl->cfg, *s, error)) {
      psm_pipeline_free (pl);
      return NULL;
    }

  GPtrArray *errors = g_ptr_array_new_with_free_func (g_free);
  GError *plugin_error = NULL;
  const char *top[] = { "task", "model", "train", "eval", "decode", "metrics", "run", "continue", NULL };
  check_keys (file, config_root_setting (&pl->cfg), "", top, errors);
  const char *model_keys[] = { "embedding", "encoder", "decoder", "head", NULL };
  config_setting_t *model = lookup (&pl->cfg, "model");
  if (model)
    check_keys (file, model, "model", model_keys, errors);
  const char *train_keys[] = { "optimizer", NULL };
  const char *continue_keys[] = { "set", NULL };
  for (guint i = 0; i < G_N_ELEMENTS (plugin_sections); i++)
    resolve_plugin_section (pl, plugin_sections[i].path, plugin_sections[i].kind,
                            plugin_sections[i].required, errors, &plugin_error);
  for (const PsmCoreSection *cs = core_sections; cs->path; cs++) {
    config_setting_t *g = lookup (&pl->cfg, cs->path);
    psm_validate_group (file, g, cs->path, cs->spec,
                        strcmp (cs->path, "train") == 0      ? train_keys
                        : strcmp (cs->path, "continue") == 0 ? continue_keys
                                                             : NULL,
                        errors);
    g_hash_table_insert (pl->sections, g_strdup (cs->path),
                         psm_section_new (cs->spec, g, cs->path, file));
  }
  resolve_metrics (pl, errors);
  check_continue_set (pl, errors);

  if (errors->len) {
    if (plugin_error && errors->len == 1) {
      g_propagate_error (error, plugin_error);
    } else {
      g_ptr_array_add (errors, NULL);
      char *msg = g_strjoinv ("\n", (char **) errors->pdata);
      g_set_error_literal (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, msg);
      g_free (msg);
      g_clear_error (&plugin_error);
    }
    g_ptr_array_unref (errors);
    psm_pipeline_free (pl);
    return NULL;
  }
  g_ptr_array_unref (errors);

  const char *rd = psm_section_string (psm_pipeline_section (pl, "run"), "dir");
  if (rd && *rd) {
    pl->run_dir = g_strdup (rd);
  } else {
    char *base = g_path_get_basename (file);
    char *dot = strrchr (base, '.');
    if (dot)
      *dot = '\0';
    pl->run_dir = g_build_filename ("runs", base, NULL);
    g_free (base);
  }
  return pl;
}

void
psm_pipeline_free (PsmPipeline *pl)
{
  if (!pl)
    return;
  config_destroy (&pl->cfg);
  psm_line_map_free (pl->lines);
  g_hash_table_destroy (pl->sections);
  g_hash_table_destroy (pl->plugins);
  g_ptr_array_unref (pl->notes);
  for (int i = 0; i < pl->n_metrics; i++)
    psm_section_free (pl->metric_sec[i]);
  g_free (pl->run_dir);
  g_strfreev (pl->sets);
  g_free (pl->file);
  g_free (pl);
}

const char *psm_pipeline_file (const PsmPipeline *pl) { return pl->file; }

gboolean
psm_pipeline_has_continue (const PsmPipeline *pl)
{
  return !pl->continued && psm_section_int (psm_pipeline_section (pl, "continue"), "steps") > 0;
}

PsmPipeline *
psm_pipeline_continued (const PsmPipeline *pl, GError **error)
{
  if (!psm_pipeline_has_continue (pl))
    return NULL;
  GPtrArray *sets = g_ptr_array_new_with_free_func (g_free);
  for (char **s = pl->sets; s && *s; s++)
    g_ptr_array_add (sets, g_strdup (*s));
  config_setting_t *l = lookup ((config_t *) &pl->cfg, "continue.set");
  int line = l ? config_setting_source_line (l) : 0;
  const char *lfile = pl->file;
  psm_line_map_where (pl->lines, line, &lfile, &line);
  if (l && config_setting_type (l) == CONFIG_TYPE_STRING)
    g_ptr_array_add (sets, g_strdup (config_setting_get_string (l)));
  else
    for (int i = 0; l && i < config_setting_length (l); i++)
      g_ptr_array_add (sets, g_strdup (config_setting_get_string (config_setting_get_elem (l, i))));
  gint64 total = psm_section_int (psm_pipeline_section (pl, "train"), "steps") +
                 psm_section_int (psm_pipeline_section (pl, "continue"), "steps");
  g_ptr_array_add (sets, g_strdup_printf ("train.steps=%" G_GINT64_FORMAT, MIN (total, (gint64) PSM_MAX_STEPS)));
  /* The run folder stays phase one's, even where continue.set names another. */
  g_ptr_array_add (sets, g_strdup_printf ("run.dir=\"%s\"", pl->run_dir));
  g_ptr_array_add (sets, NULL);
  GError *e = NULL;
  PsmPipeline *two = psm_pipeline_load (pl->file, (const char *const *) sets->pdata, &e);
  g_ptr_array_unref (sets);
  if (!two) {
    g_set_error (error, e->domain, e->code, "%s:%d: continue.set: the second phase's pipeline is invalid:\n%s",
                 lfile, line, e->message);
    g_error_free (e);
    return NULL;
  }
  two->continued = TRUE;
  two->eval_only = pl->eval_only;
  two->text_only = pl->text_only;
  return two;
}

const char *
psm_pipeline_note (const PsmPipeline *pl, guint i)
{
  return i < pl->notes->len ? g_ptr_array_index (pl->notes, i) : NULL;
}
const char *psm_pipeline_run_dir (const PsmPipeline *pl) { return pl->run_dir; }
void psm_pipeline_set_eval_only (PsmPipeline *pl, gboolean eval_only) { pl->eval_only = eval_only; }
gboolean psm_pipeline_eval_only (const PsmPipeline *pl) { return pl->eval_only || pl->text_only; }
void psm_pipeline_set_text_only (PsmPipeline *pl, gboolean text_only) { pl->text_only = text_only; }
gboolean psm_pipeline_text_only (const PsmPipeline *pl) { return pl->text_only; }
int psm_pipeline_n_metrics (const PsmPipeline *pl) { return pl->n_metrics; }

const PsmSection *
psm_pipeline_section (const PsmPipeline *pl, const char *path)
{
  return g_hash_table_lookup (pl->sections, path);
}

const PsmPlugin *
psm_pipeline_plugin (const PsmPipeline *pl, const char *path)
{
  return g_hash_table_lookup (pl->plugins, path);
}

const PsmPlugin *
psm_pipeline_metric (const PsmPipeline *pl, int i, const PsmSection **section)
{
  if (section)
    *section = pl->metric_sec[i];
  return pl->metric[i];
}

gboolean
psm_pipeline_write (const PsmPipeline *pl, const char *path, GError **error)
{
  /* config_write_file() ignores write errors: write, flush and sync here,
   * and rename only a complete file into place. */
  char *tmp;
  FILE *f = psm_fopen_temp (path, &tmp);
  int e = errno;
  gboolean ok = f != NULL;
  if (ok) {
    config_write (&pl->cfg, f);
    ok = !ferror (f) && fflush (f) == 0 && fsync (fileno (f)) == 0;
    e = errno;
    if (fclose (f) != 0 && ok) {
      ok = FALSE;
      e = errno;
    }
  }
  if (ok && rename (tmp, path) != 0) {
    ok = FALSE;
    e = errno;
  }
  if (!ok) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot write the resolved pipeline: %s",
                 path, g_strerror (e));
    unlink (tmp);
  }
  g_free (tmp);
  return ok;
}
