/* psm-run — train, evaluate and decode psm pipelines.
 * Exit codes: 0 ok, 1 runtime error, 2 usage or config error. */
#include "config.h"
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "psm/psm-pipeline.h"
#include "psm-tools.h"

char *openblas_get_corename (void);   /* OpenBLAS extension, in its cblas.h */

static gchar **opt_set;
static gchar *opt_describe;
static gboolean opt_resume, opt_check, opt_list, opt_quiet, opt_version, opt_json, opt_profile;
static gchar *opt_mode, *opt_split, *opt_sep, *opt_source, *opt_input;
static gchar **opt_metric;
static gint64 opt_stop_after;

static GOptionEntry entries[] = {
  { "set", 's', 0, G_OPTION_ARG_STRING_ARRAY, &opt_set,
    "Override a setting, e.g. --set model.head.plugin=softmax (repeatable)", "KEY.PATH=VALUE" },
  { "mode", 'm', 0, G_OPTION_ARG_STRING, &opt_mode,
    "all (train, then test; default), train, eval (score the best checkpoint), decode (write its outputs)", "MODE" },
  { "split", 0, 0, G_OPTION_ARG_STRING, &opt_split, "Split for eval/decode: valid or test (default test)", "SPLIT" },
  { "resume", 'r', 0, G_OPTION_ARG_NONE, &opt_resume, "Continue training from the run folder's last checkpoint", NULL },
  { "stop-after", 0, 0, G_OPTION_ARG_INT64, &opt_stop_after,
    "Train N updates, write last.ckpt and stop (as SIGTERM does); go on later with --resume", "N" },
  { "check", 0, 0, G_OPTION_ARG_NONE, &opt_check,
    "Parse, validate, build, train a few steps on tiny data, decode, round-trip a checkpoint; write nothing", NULL },
  { "list", 'l', 0, G_OPTION_ARG_NONE, &opt_list, "List every plugin and core section with its parameters", NULL },
  { "describe", 0, 0, G_OPTION_ARG_STRING, &opt_describe,
    "Show one plugin in full (kind, file, ABI, hooks, every parameter), or a core section such as train; "
    "NAME, KIND/NAME or a plugin file", "NAME" },
  { "quiet", 'q', 0, G_OPTION_ARG_NONE, &opt_quiet, "Only print results and errors", NULL },
  { "profile", 0, 0, G_OPTION_ARG_NONE, &opt_profile,
    "Time every op of the training steps by phase (encoder, decoder, head, optimiser); print the table at the end", NULL },
  { "json", 0, 0, G_OPTION_ARG_NONE, &opt_json,
    "decode: also write DIR/decode.SPLIT.jsonl (tokens, p_gen, top attention positions)", NULL },
  { "input", 'i', 0, G_OPTION_ARG_FILENAME, &opt_input,
    "decode: summarise raw texts instead of a split, one article a line (- for standard input), to standard output",
    "FILE" },
  { "metric", 0, 0, G_OPTION_ARG_STRING_ARRAY, &opt_metric,
    "score: a text metric to compute (repeatable), e.g. rouge", "NAME" },
  { "sep", 0, 0, G_OPTION_ARG_STRING, &opt_sep,
    "score: the token separating sentences in the files (default <q>; \"\" for none)", "TOKEN" },
  { "source", 0, 0, G_OPTION_ARG_FILENAME, &opt_source, "score: the line-aligned source texts (novel_ngrams)", "FILE" },
  { "version", 0, 0, G_OPTION_ARG_NONE, &opt_version, "Print the version", NULL },
  { NULL }
};

static void
print_spec (const PsmParamSpec *spec)
{
  if (!spec || !spec->name) {
    printf ("      (no parameters)\n");
    return;
  }
  for (const PsmParamSpec *p = spec; p->name; p++) {
    char *range = psm_param_range (p);
    printf ("      %-16s %-7s %-10s %-22s %s\n", p->name, psm_param_type_name (p->type),
            p->def ? (*p->def ? p->def : "\"\"") : "(required)", range, p->doc);
    g_free (range);
  }
}

static int
do_list (void)
{
  GPtrArray *errors = g_ptr_array_new_with_free_func (g_free);
  GPtrArray *all = psm_plugin_load_all (errors);
  printf ("psm %s plugins (search path:", PACKAGE_VERSION);
  for (const char *const *d = psm_plugin_path (); *d; d++)
    printf (" %s", *d);
  printf (")\n      %-16s %-7s %-10s %-22s %s\n", "parameter", "type", "default", "range", "meaning");
  PsmKind last = 0;
  for (guint i = 0; i < all->len; i++) {
    const PsmPlugin *pl = g_ptr_array_index (all, i);
    if (pl->desc->kind != last) {
      printf ("\n%ss:\n", psm_kind_name (pl->desc->kind));
      last = pl->desc->kind;
    }
    printf ("  %s — %s\n    %s\n", pl->desc->name, pl->desc->description, pl->path);
    print_spec (pl->desc->params);
  }
  printf ("\ncore sections:\n");
  for (const PsmCoreSection *cs = psm_core_sections (); cs->path; cs++) {
    printf ("  %s — %s\n", cs->path, cs->doc);
    print_spec (cs->spec);
  }
  for (guint i = 0; i < errors->len; i++)
    fprintf (stderr, "psm-run: warning: %s\n", (char *) g_ptr_array_index (errors, i));
  int rc = errors->len ? 1 : 0;
  g_ptr_array_unref (all);
  g_ptr_array_unref (errors);
  return rc;
}

static int fail (GError *e);

/* Where a plugin of each kind is configured in a pipeline file. */
static const char *
kind_section (PsmKind k)
{
  switch (k) {
  case PSM_KIND_ENCODER: return "model.encoder";
  case PSM_KIND_DECODER: return "model.decoder";
  case PSM_KIND_HEAD: return "model.head";
  case PSM_KIND_TASK: return "task";
  default: return "metrics (a list entry: \"NAME\" or { plugin = \"NAME\"; ... })";
  }
}

static void
describe_params (const PsmParamSpec *spec)
{
  if (!spec || !spec->name) {
    printf ("  (none)\n");
    return;
  }
  for (const PsmParamSpec *p = spec; p->name; p++) {
    char *range = psm_param_range (p);
    printf ("  %s\n", p->name);
    printf ("    %-9s %s\n", "type", psm_param_type_name (p->type));
    printf ("    %-9s %s\n", "default", p->def ? (*p->def ? p->def : "\"\" (empty)") : "(none: required)");
    if (p->type == PSM_PARAM_CHOICE)
      printf ("    %-9s %s\n", "choices", p->choices);
    else if (*range && strcmp (range, "-") != 0)
      printf ("    %-9s %s\n", "range", range);
    printf ("    %-9s %s\n", "meaning", p->doc);
    g_free (range);
  }
}

/* psm-run --describe NAME: one plugin (or core section) in full, as
 * gst-inspect shows one element. */
static int
do_describe (const char *what)
{
  GError *e = NULL;
  const PsmPlugin *pl = NULL;
  if (strchr (what, '/') && g_str_has_suffix (what, ".so")) {
    pl = psm_plugin_load_file (what, &e);
  } else if (strchr (what, '/')) {
    char **kn = g_strsplit (what, "/", 2);
    PsmKind k;
    if (!psm_kind_from_name (kn[0], &k)) {
      fprintf (stderr, "psm-run: --describe %s: '%s' is not a plugin kind (encoder, decoder, head, task, metric)\n",
               what, kn[0]);
      g_strfreev (kn);
      return 2;
    }
    pl = psm_plugin_find (k, kn[1], &e);
    g_strfreev (kn);
  } else {
    for (const PsmCoreSection *cs = psm_core_sections (); cs->path; cs++)
      if (strcmp (cs->path, what) == 0) {
        printf ("Core section %s\n  %s\n\nParameters:\n", cs->path, cs->doc);
        describe_params (cs->spec);
        return 0;
      }
    GString *kinds = g_string_new (NULL);
    for (PsmKind k = PSM_KIND_ENCODER; k <= PSM_KIND_LAST; k++) {
      GError *ek = NULL;
      const PsmPlugin *p = psm_plugin_find (k, what, &ek);
      if (p) {
        g_string_append_printf (kinds, "%s%s/%s", kinds->len ? ", " : "", psm_kind_name (k), what);
        if (!pl)
          pl = p;
      } else if (ek->code != PSM_PLUGIN_ERROR_NOT_FOUND && !e) {
        e = ek;
        continue;
      }
      g_clear_error (&ek);
    }
    if (pl && strchr (kinds->str, ',')) {
      fprintf (stderr, "psm-run: --describe %s: several plugins have that name (%s); say which\n", what, kinds->str);
      g_string_free (kinds, TRUE);
      g_clear_error (&e);
      return 2;
    }
    g_string_free (kinds, TRUE);
    if (!pl && !e)
      g_set_error (&e, PSM_PLUGIN_ERROR, PSM_PLUGIN_ERROR_NOT_FOUND,
                   "--describe %s: no plugin or core section of that name (psm-run --list shows them all)", what);
    if (pl)
      g_clear_error (&e);
  }
  if (!pl)
    return fail (e);
  const PsmPluginDesc *d = pl->desc;
  printf ("Plugin %s\n", d->name);
  printf ("  %-12s %s\n", "kind", psm_kind_name (d->kind));
  printf ("  %-12s %s\n", "description", d->description);
  printf ("  %-12s %s\n", "file", pl->path);
  printf ("  %-12s %u.%u (this psm: %d.%d)\n", "ABI", d->abi_major, d->abi_minor, PSM_ABI_MAJOR, PSM_ABI_MINOR);
  printf ("  %-12s %s\n", "configured", kind_section (d->kind));
  printf ("  %-12s %s\n", "init", d->init ? "yes (runs once at load)" : "no");
  PsmHookInfo h[64];
  int n = MIN (psm_plugin_hooks (pl, h, 64), 64);
  printf ("\nClass hooks:\n");
  for (int i = 0; i < n; i++)
    printf ("  %-14s %-9s %s\n", h[i].name, h[i].required ? "required" : "optional", h[i].set ? "set" : "-");
  printf ("\nParameters:\n");
  describe_params (d->params);
  return 0;
}

/* An allocation in the middle of a step failed (sizes were checked before
 * the run against what the process may use; this is what they missed).
 * Checkpoints and logs are written atomically or flushed per record, so
 * stopping here loses nothing but the step. */
static void
out_of_memory (size_t bytes, const char *what)
{
  fflush (stdout);
  fprintf (stderr, "\npsm-run: out of memory: cannot allocate %.1f MiB for %s; a step of this pipeline "
           "needs more memory than this process may use: lower train.batch or eval.batch, or the model's "
           "sizes (checkpoints already written are intact)\n", bytes / (1024.0 * 1024), what);
  _exit (1);
}

static int
fail (GError *e)
{
  gboolean usage = e->domain == PSM_CONFIG_ERROR || e->domain == PSM_PLUGIN_ERROR ||
                   (e->domain == PSM_RUN_ERROR && e->code == PSM_RUN_ERROR_USAGE) ||
                   e->domain == G_OPTION_ERROR;
  if (psm_dist_size () > 1)
    fprintf (stderr, "psm-run: rank %d of %d: %s\n", psm_dist_rank (), psm_dist_size (), e->message);
  else
    fprintf (stderr, "psm-run: %s\n", e->message);
  g_error_free (e);
  return usage ? 2 : 1;
}

static int run (int argc, char **argv);

/* The library's reports (psm_set_output): results and the steps of a run
 * on standard output, notes on standard error, the live progress line on
 * standard error, rewritten in place with a carriage return. */
static void
print_output (PsmOutKind kind, const char *text, void *user_data)
{
  switch (kind) {
  case PSM_OUT_RESULT:
    fputs (text, stdout);
    break;
  case PSM_OUT_NOTE:
    fputs (text, stderr);
    break;
  case PSM_OUT_PROGRESS:
    fprintf (stderr, "\r%s   ", text);
    break;
  case PSM_OUT_PROGRESS_END:
    fputs ("\n", stderr);
    break;
  }
}

/* Under mpirun: one rank's failure ends the whole job (the others would
 * wait for it in the next allreduce); rank 0 alone prints results. */
int
main (int argc, char **argv)
{
  GError *e = NULL;
  psm_set_output (print_output, NULL);
  if (!psm_dist_init (&argc, &argv, &e))
    return fail (e);
  if (psm_dist_rank () != 0 && !freopen ("/dev/null", "w", stdout))
    return 1;
  int rc = run (argc, argv);
  if (rc == 1 || rc == 2)   /* an error; 128 + N: stopped by signal N, checkpoint written */
    psm_dist_abort (rc);
  psm_dist_finalize ();
  return rc;
}

static int
run (int argc, char **argv)
{
  setlocale (LC_ALL, "");
  setlocale (LC_NUMERIC, "C");
  psm_set_oom_handler (out_of_memory);
  /* a file-size limit (ulimit -f) is a write error with a message, like a
   * full disk, not a kill */
  signal (SIGXFSZ, SIG_IGN);
  GError *e = NULL;
  /* sub-commands with options of their own */
  if (argc >= 2 && strcmp (argv[1], "view") == 0)
    return psm_view_main (argc - 1, argv + 1);
  if (argc >= 2 && strcmp (argv[1], "plot") == 0)
    return psm_plot_main (argc - 1, argv + 1);
  if (argc >= 2 && strcmp (argv[1], "serve") == 0)
    return psm_serve_main (argc - 1, argv + 1);
  if (argc >= 2 && strcmp (argv[1], "convert") == 0)
    return psm_convert_main (argc - 1, argv + 1);
  GOptionContext *ctx = g_option_context_new ("PIPELINE.cfg — train, evaluate and decode a psm pipeline");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_option_context_set_description (ctx,
    "psm-run score --metric NAME [--sep TOKEN] [--source FILE] [--set NAME.key=value] SUMMARIES REFERENCES\n"
    "  [REFERENCES...]: scores line-aligned files with text metrics, without a pipeline\n"
    "  (several reference files: alternative references, for bleu).\n"
    "psm-run view RUN_DIR|DECODE.jsonl: an HTML page of decoded examples (attention, copies, ROUGE).\n"
    "psm-run plot RUN_DIR...: learning curves of runs as SVG.\n"
    "psm-run serve RUN_DIR --port P: a summariser over HTTP (POST /summarize).\n"
    "(psm-run view|plot|serve --help: their options.)\n\n"
    "Exit status: 0 ok, 1 runtime error (NaN loss, I/O, corrupt data or checkpoint),\n"
    "2 usage or configuration error. Plugins are searched in $PSM_PLUGIN_PATH, then\n"
    "the installed plugin folder. See psm-run(1) and psm-pipeline(5).\n");
  if (!g_option_context_parse (ctx, &argc, &argv, &e)) {
    fprintf (stderr, "psm-run: %s (try --help)\n", e->message);
    g_error_free (e);
    g_option_context_free (ctx);
    return 2;
  }
  g_option_context_free (ctx);
  if (opt_version) {
#ifdef HAVE_MPI
    const char *mpi = "MPI: yes";
#else
    const char *mpi = "MPI: no";
#endif
    printf ("psm-run %s (plugin ABI %d.%d; OpenBLAS kernels: %s; %s)\n", PACKAGE_VERSION, PSM_ABI_MAJOR,
            PSM_ABI_MINOR, openblas_get_corename (), mpi);
    return 0;
  }
  if (opt_list)
    return do_list ();
  if (opt_describe)
    return do_describe (opt_describe);
  if (argc >= 2 && strcmp (argv[1], "score") == 0) {
    if (argc < 4) {
      fprintf (stderr, "psm-run: score: expected two files or more, SUMMARIES REFERENCES [REFERENCES...] (try "
               "--help)\n");
      return 2;
    }
    const char **refs = g_new0 (const char *, argc - 2);   /* NULL-ended */
    for (int i = 3; i < argc; i++)
      refs[i - 3] = argv[i];
    gboolean ok = psm_score_files ((const char *const *) opt_metric, (const char *const *) opt_set, argv[2], refs,
                                   opt_source, opt_sep ? opt_sep : "<q>", &e);
    g_free (refs);
    return ok ? 0 : fail (e);
  }
  if (argc != 2) {
    fprintf (stderr, "psm-run: expected one pipeline file (try --help)\n");
    return 2;
  }
  const char *mode = opt_mode ? opt_mode : "all";
  if (strcmp (mode, "all") && strcmp (mode, "train") && strcmp (mode, "eval") && strcmp (mode, "decode")) {
    fprintf (stderr, "psm-run: --mode %s: expected all, train, eval or decode\n", mode);
    return 2;
  }
  PsmSplit split = PSM_SPLIT_TEST;
  if (opt_split && strcmp (opt_split, "test") != 0) {
    if (strcmp (opt_split, "valid") != 0) {
      fprintf (stderr, "psm-run: --split %s: expected valid or test\n", opt_split);
      return 2;
    }
    split = PSM_SPLIT_VALID;
  }
  if (opt_input && strcmp (mode, "decode") != 0) {
    fprintf (stderr, "psm-run: --input goes with --mode decode\n");
    return 2;
  }
  if (opt_stop_after < 0 || (opt_stop_after > 0 && (opt_check || strcmp (mode, "eval") == 0 ||
                                                      strcmp (mode, "decode") == 0))) {
    fprintf (stderr, "psm-run: --stop-after takes a positive number of updates and goes with training\n");
    return 2;
  }
  if (opt_resume && opt_check) {
    fprintf (stderr, "psm-run: --resume and --check exclude each other\n");
    return 2;
  }

  /* rank 0 alone evaluates, decodes and writes outputs */
  gboolean training = opt_check || strcmp (mode, "all") == 0 || strcmp (mode, "train") == 0;
  if (psm_dist_rank () != 0 && !training)
    return 0;
  PsmPipeline *pl = psm_pipeline_load (argv[1], (const char *const *) opt_set, &e);
  if (!pl)
    return fail (e);
  for (guint i = 0; psm_pipeline_note (pl, i); i++)
    fprintf (stderr, "psm-run: note: %s\n", psm_pipeline_note (pl, i));
  gboolean eval_only = !opt_check && (strcmp (mode, "eval") == 0 || strcmp (mode, "decode") == 0);
  psm_pipeline_set_eval_only (pl, eval_only);
  psm_pipeline_set_text_only (pl, eval_only && opt_input != NULL);   /* raw text: no split is read */
  /* eval and decode: the phase the run folder has reached, before the model is built */
  if (eval_only && !psm_run_select_phase (&pl, &e)) {
    psm_pipeline_free (pl);
    return fail (e);
  }
  PsmModel *m = psm_model_new (pl, opt_check, &e);
  if (!m) {
    psm_pipeline_free (pl);
    return fail (e);
  }
  gboolean ok = TRUE, stopped = FALSE;
  if (opt_check) {
    ok = psm_run_check_phases (&pl, &m, &e);
  } else {
    if (strcmp (mode, "all") == 0 || strcmp (mode, "train") == 0) {
      gboolean quiet = opt_quiet || psm_dist_rank () != 0;
      PsmTrainOptions to = { opt_resume, quiet, !quiet && isatty (STDERR_FILENO), opt_profile, (long) opt_stop_after, 0, 0, 0 };
      ok = psm_train_phases (&pl, &m, &to, &e);
      if (ok && to.stopped > 0) {   /* SIGINT/SIGTERM: checkpoint written, exit as the signal would */
        psm_model_free (m);
        psm_pipeline_free (pl);
        g_strfreev (opt_set);
        return 128 + to.stopped;
      }
      stopped = to.stopped != 0;
    }
    if (ok && !stopped && psm_dist_rank () == 0 && strcmp (mode, "all") == 0)
      ok = psm_run_eval (m, PSM_SPLIT_TEST, psm_model_has_decoder (m), FALSE, &e);   /* + the summaries */
    if (ok && strcmp (mode, "eval") == 0)
      ok = psm_run_eval (m, split, FALSE, FALSE, &e);
    if (ok && strcmp (mode, "decode") == 0)
      ok = opt_input ? psm_run_decode_input (m, opt_input, opt_json, &e) : psm_run_eval (m, split, TRUE, opt_json, &e);
  }
  psm_model_free (m);
  psm_pipeline_free (pl);
  g_strfreev (opt_set);
  return ok ? 0 : fail (e);
}
