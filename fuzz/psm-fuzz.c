/* psm-fuzz.c — fuzz targets for everything psm reads from outside: the
 * pipeline reader with --set overrides, the checkpoint reader, and the task
 * plugins' data readers (CNN/DailyMail jsonl and .source/.target, the
 * headline task's article/title files, PTB/WikiText, the NMT task's
 * parallel text and lexicon TSV, and the vocabularies a run folder keeps),
 * and what the tools read: psm-run view's decoded records and psm-run
 * serve's request bodies; and a language model's training-stream state
 * (read from a checkpoint, merged from MPI ranks).
 *
 * Each target takes one input, writes it where the reader expects a file,
 * reads it, and on success exercises what was read (examples counted,
 * batches drawn); errors are expected, crashes, hangs and sanitizer
 * reports are bugs. Built two ways: with libFuzzer (fuzz/run.sh, a clang
 * build with -fsanitize=fuzzer), one binary per target chosen by
 * PSM_FUZZ_TARGET; and into tests/fuzz-replay, which make check runs over
 * the kept corpus fuzz/corpus/TARGET/ (found inputs become regression
 * inputs). */
#include "config.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glib/gstdio.h>
#include <libconfig.h>
#include <psm/psm.h>
#include "psm/psm-pipeline.h"
#include "config/config-internal.h"
#include "run/run-internal.h"
#include "psm-fuzz.h"
#include "psm-tools.h"

static char *dir;   /* this process's files */

static void
remove_dir (void)
{
  GDir *d = dir ? g_dir_open (dir, 0, NULL) : NULL;
  const char *name;
  while (d && (name = g_dir_read_name (d))) {
    char *p = g_build_filename (dir, name, NULL);
    g_unlink (p);
    g_free (p);
  }
  if (d)
    g_dir_close (d);
  if (dir)
    g_rmdir (dir);
}

static char *
path_of (const char *name)
{
  if (!dir) {
    dir = g_dir_make_tmp ("psm-fuzz-XXXXXX", NULL);
    if (!dir)
      abort ();
    atexit (remove_dir);
  }
  return g_build_filename (dir, name, NULL);
}

/* Writes data to name in the folder; the path (g_free). A new file each
 * time: ext4 writes a file that was truncated and rewritten out to disk
 * when it is closed (its replace-via-truncate heuristic), which made every
 * execution wait for the disk (fuzz/run.sh also puts the folder on
 * /dev/shm). */
static char *
put (const char *name, const void *data, size_t n)
{
  char *p = path_of (name);
  g_unlink (p);
  FILE *f = fopen (p, "wb");   /* (not g_file_set_contents: it syncs) */
  if (!f || (n && fwrite (data, 1, n, f) != n) || fclose (f) != 0)
    abort ();
  return p;
}

/* The part of an input before the first "\n%%\n" (*rest: after it, or
 * NULL). */
static char *
split_input (const uint8_t *d, size_t n, char **rest)
{
  char *s = g_strndup ((const char *) d, n);   /* stops at a NUL: fine for text */
  char *cut = strstr (s, "\n%%\n");
  *rest = NULL;
  if (cut) {
    *cut = '\0';
    *rest = cut + 4;
  }
  return s;
}

/* --- pipeline: the file, then "\n%%\n" and one --set assignment a line --- */
static int
psm_fuzz_pipeline (const uint8_t *d, size_t n)
{
  char *sets_text;
  char *text = split_input (d, n, &sets_text);
  char *p = put ("fuzz.cfg", text, strlen (text));
  char **sets = sets_text ? g_strsplit (sets_text, "\n", 16) : NULL;
  GError *e = NULL;
  PsmPipeline *pl = psm_pipeline_load (p, (const char *const *) sets, &e);
  if (pl) {
    for (guint i = 0; psm_pipeline_note (pl, i); i++)
      (void) strlen (psm_pipeline_note (pl, i));
    (void) psm_pipeline_run_dir (pl);
    psm_pipeline_free (pl);
  }
  g_clear_error (&e);
  g_strfreev (sets);
  g_free (p);
  g_free (text);
  return 0;
}

/* --- checkpoint: against a fixed small model with Adam state --- */
static PsmParams *ck_params;
static PsmOptim *ck_optim;

static void
checkpoint_model (void)
{
  if (ck_params)
    return;
  ck_params = psm_params_new ();
  int a[2] = { 3, 4 }, b[1] = { 4 }, c[2] = { 2, 5 };
  psm_params_add (ck_params, "enc.w", 2, a, PSM_INIT_XAVIER, 0);
  psm_params_add (ck_params, "enc.b", 1, b, PSM_INIT_ZEROS, 0);
  psm_params_add (ck_params, "head.w", 2, c, PSM_INIT_NORMAL, 0.1f);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  if (!psm_params_finalize (ck_params, &rng, NULL))
    abort ();
  PsmOptConfig oc = { PSM_OPT_ADAM, 0.01, 0.9, 0.999, 1e-8, 0.1, 0.95, 0, 0 };
  ck_optim = psm_optim_new (&oc, ck_params);
}

static int
psm_fuzz_checkpoint (const uint8_t *d, size_t n)
{
  checkpoint_model ();
  char *p = put ("fuzz.ckpt", d, n);
  PsmCheckpointMeta meta = { 0 };
  GError *e = NULL;
  if (psm_checkpoint_load (p, ck_params, ck_optim, &meta, &e))
    g_clear_pointer (&meta.stream, g_bytes_unref);
  g_clear_error (&e);
  PsmCheckpointMeta meta2 = { 0 };   /* and as evaluation reads it: without optimiser */
  if (psm_checkpoint_load (p, ck_params, NULL, &meta2, &e))
    g_clear_pointer (&meta2.stream, g_bytes_unref);
  g_clear_error (&e);
  g_free (p);
  return 0;
}

void
psm_fuzz_write_checkpoint_seed (const char *path)
{
  checkpoint_model ();
  PsmCheckpointMeta meta = { 7, { { 1, 2, 3, 4 } }, 0.5, 1.0, 0.6, 1, NULL };
  GError *e = NULL;
  if (!psm_checkpoint_save (path, ck_params, ck_optim, TRUE, &meta, &e)) {
    fprintf (stderr, "%s\n", e->message);
    exit (1);
  }
}

/* --- a language model's training-stream state (in a checkpoint: where
 * the task stood, the encoder state carried into the next segment, the
 * pointer head's window), restored for one process and merged from MPI
 * ranks' --- */

static PsmPipeline *ss_pl;
static PsmModel *ss_model;

/* A tiny LSTM LM with the pointer sentinel (2 streams, window 4). */
static PsmModel *
stream_model (void)
{
  if (ss_model)
    return ss_model;
  const char *text = "a b c a b\nc a b c a\nb b a c\n";
  char *tr = put ("streams.txt", text, strlen (text)), *run = path_of ("run");
  char *cfg = g_strdup_printf ("task = { plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; "
                               "bptt = 3; };\nmodel = { embedding = { dim = 4; }; encoder = { plugin = \"lstm_lm\"; "
                               "hidden = 3; layers = 2; }; head = { plugin = \"pointer_sentinel\"; window = 4; }; };\n"
                               "train = { batch = 2; };\nrun = { dir = \"%s\"; };\n", tr, tr, tr, run);
  char *p = put ("streams.cfg", cfg, strlen (cfg));
  GError *e = NULL;
  ss_pl = psm_pipeline_load (p, NULL, &e);
  ss_model = ss_pl ? psm_model_new (ss_pl, FALSE, &e) : NULL;
  if (!ss_model) {
    fprintf (stderr, "psm-fuzz: %s\n", e ? e->message : "no model");
    abort ();
  }
  g_free (tr);
  g_free (run);
  g_free (cfg);
  g_free (p);
  return ss_model;
}

static int
psm_fuzz_stream_state (const uint8_t *d, size_t n)
{
  PsmModel *m = stream_model ();
  GBytes *b = g_bytes_new (d, n);
  GError *e = NULL;
  for (int B = 1; B <= 2; B++)
    if (!psm_model_restore_stream_state (m, b, B, &e))
      g_clear_error (&e);
  if (!psm_model_restore_stream_rows (m, b, 2, 1, 1, &e))
    g_clear_error (&e);
  GPtrArray *parts = g_ptr_array_new ();
  g_ptr_array_add (parts, b);
  g_ptr_array_add (parts, b);
  GBytes *merged = psm_model_stream_state_merge (m, parts, &e);
  g_clear_error (&e);
  if (merged) {   /* two ranks' rows: a state of twice the streams */
    gsize len;
    const guint8 *q = g_bytes_get_data (merged, &len);
    gint32 rows;
    memcpy (&rows, q + 16, 4);
    if (rows > 0 && rows <= 4096 && !psm_model_restore_stream_state (m, merged, rows, &e))
      g_clear_error (&e);
    g_bytes_unref (merged);
  }
  g_ptr_array_unref (parts);
  g_bytes_unref (b);
  return 0;
}

void
psm_fuzz_write_stream_state_seed (const char *path)
{
  PsmModel *m = stream_model ();
  PsmRng rng;
  psm_rng_seed (&rng, 5);
  GError *e = NULL;
  if (!psm_model_train_batch (m, 2, &rng, &e)) {
    fprintf (stderr, "psm-fuzz: %s\n", e->message);
    exit (1);
  }
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  psm_model_loss (m, g, psm_model_batch (m));
  psm_graph_free (g);
  GBytes *st = psm_model_stream_state (m);
  gsize len;
  const void *data = g_bytes_get_data (st, &len);
  if (!g_file_set_contents (path, data, (gssize) len, &e)) {
    fprintf (stderr, "psm-fuzz: %s\n", e->message);
    exit (1);
  }
  g_bytes_unref (st);
}

/* --- tasks --- */

/* What psm-run would refuse from a task that accepted its files (its
 * self-description, a batch) is a bug in the task: abort with the core's
 * message. */
static void
must_hold (gboolean ok, GError *const *e)
{
  if (!ok) {
    fprintf (stderr, "psm-fuzz: %s\n", *e ? (*e)->message : "?");
    abort ();
  }
}

/* Creates task plugin name from the section body cfg (in run folder
 * run_dir, when not NULL, as psm-run --mode eval does, or as decoding raw
 * text does when text_only), and if it reads its files, counts and draws a
 * few batches of each split, and with text_only a batch of raw text, each
 * checked as the core checks them. */
static void
run_task_in (const char *name, const char *cfg, const char *run_dir, gboolean text_only)
{
  GError *e = NULL;
  const PsmPlugin *pl = psm_plugin_find (PSM_KIND_TASK, name, &e);
  if (!pl) {
    fprintf (stderr, "psm-fuzz: %s\n", e->message);
    abort ();
  }
  const PsmTaskClass *k = pl->desc->klass;
  config_t c;
  config_init (&c);
  char *full = g_strdup_printf ("s = {\n%s\n};\n", cfg);
  if (!config_read_string (&c, full))
    abort ();
  g_free (full);
  config_setting_t *grp = config_lookup (&c, "s");
  GPtrArray *errs = g_ptr_array_new_with_free_func (g_free);
  const char *extra[] = { "plugin", NULL };
  psm_validate_group ("fuzz.cfg", grp, "task", pl->desc->params, extra, errs);
  if (errs->len == 0) {
    PsmSection *sec = psm_section_new (pl->desc->params, grp, "task", "fuzz.cfg");
    PsmTaskCtx ctx = { sizeof ctx, 1, FALSE, run_dir, run_dir != NULL, text_only };
    void *t = k->create (sec, &ctx, &e);
    if (t) {
      PsmTaskInfo info;
      memset (&info, 0, sizeof info);
      info.size = sizeof info;
      k->info (t, &info);
      must_hold (psm_task_info_validate (&info, name, &e), &e);
      PsmBatch b;
      psm_batch_init (&b);
      PsmRng rng;
      psm_rng_seed (&rng, 3);
      gboolean trains = k->n_examples (t, PSM_SPLIT_TRAIN) > 0 || info.streams;
      for (int i = 0; i < 3 && trains; i++) {
        if (!psm_task_train_batch (k, t, 2, &rng, &b, &e)) {
          g_clear_error (&e);
          break;
        }
        must_hold (psm_batch_validate (&b, &info, 2, name, &e), &e);
      }
      for (int s = PSM_SPLIT_VALID; s <= PSM_SPLIT_TEST; s++) {
        long n = k->n_examples (t, (PsmSplit) s);
        if (n <= 0 && !info.streams)
          continue;
        if (psm_task_eval_batch (k, t, (PsmSplit) s, 0, (int) MIN (MAX (n, 1), 3), &b, &e))
          must_hold (psm_batch_validate (&b, &info, 3, name, &e), &e);
        g_clear_error (&e);
      }
      gboolean (*text_batch) (void *, const char *const *, int, PsmBatch *, GError **) =
        PSM_CLASS_HOOK (k, text_batch);
      const char *texts[3] = { "The cat sat on the mat.", "", "Zorglub met X999Q in Paris; \"no\", he said . <unk>" };
      if (text_only && text_batch && text_batch (t, texts, 3, &b, &e)) {
        must_hold (psm_batch_validate (&b, &info, 3, name, &e), &e);
        for (int i = 0; i < b.B; i++)
          for (int p = 0; p < b.T; p++)
            if (PSM_AT (b.src_mask, &b, p, i) > 0 && !k->token_text (t, &b, i, PSM_AT (b.src_ext, &b, p, i)))
              abort ();
      }
      g_clear_error (&e);
      psm_batch_clear (&b);
      k->destroy (t);
    }
    g_clear_error (&e);
    psm_section_free (sec);
  }
  g_ptr_array_unref (errs);
  config_destroy (&c);
}

static void
run_task (const char *name, const char *cfg)
{
  run_task_in (name, cfg, NULL, FALSE);
}

static int
psm_fuzz_cnndm_jsonl (const uint8_t *d, size_t n)
{
  char *p = put ("train.jsonl", d, n);
  char *cfg = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 20; max_src = 8; "
                               "max_tgt = 4;", p, p);
  run_task ("cnndm", cfg);
  g_free (cfg);
  g_free (p);
  return 0;
}

/* Two files from one input (the first's text, then "\n%%\n" and the
 * second's), named first and second, read by task plugin task from the
 * section body cfg, in which each '@' stands for the first file's path. */
static void
run_task_on_pair (const uint8_t *d, size_t n, const char *first, const char *second, const char *task, const char *cfg)
{
  char *rest;
  char *text = split_input (d, n, &rest);
  char *p1 = put (first, text, strlen (text));
  char *p2 = put (second, rest ? rest : "", rest ? strlen (rest) : 0);
  char **parts = g_strsplit (cfg, "@", -1);
  char *body = g_strjoinv (p1, parts);
  run_task (task, body);
  g_free (body);
  g_strfreev (parts);
  g_free (p1);
  g_free (p2);
  g_free (text);
}

/* .source, then "\n%%\n" and the .target */
static int
psm_fuzz_cnndm_lines (const uint8_t *d, size_t n)
{
  run_task_on_pair (d, n, "train.source", "train.target", "cnndm",
                    "plugin = \"cnndm\"; train = \"@\"; valid = \"@\"; vocab = 20; max_src = 8; max_tgt = 4;");
  return 0;
}

/* article lines, then "\n%%\n" and the title lines */
static int
psm_fuzz_headline (const uint8_t *d, size_t n)
{
  run_task_on_pair (d, n, "train.article.txt", "train.title.txt", "headline",
                    "plugin = \"headline\"; train = \"@\"; valid = \"@\"; test = \"@\"; min_count = 1; "
                    "src_vocab = 30; tgt_vocab = 20; max_src = 8; max_tgt = 4; sentences = 2;");
  return 0;
}

/* PTB's and WikiText's format (one reader): the input is all three splits */
static int
psm_fuzz_lm (const uint8_t *d, size_t n)
{
  char *p = put ("wiki.train.tokens", d, n);
  char *cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; bptt = 3;", p, p, p);
  run_task ("lm", cfg);
  g_free (cfg);
  g_free (p);
  return 0;
}

/* The translation task with the simple tokeniser: the lexicon TSV, then
 * optionally "\n%%\n", the source sentences, "\n%%\n" and the target
 * sentences (every split's text); without them a fixed two-pair text. */
static int
psm_fuzz_nmt (const uint8_t *d, size_t n)
{
  char *par;
  char *lex = split_input (d, n, &par);
  char *prefix;
  if (par) {
    char *tgt = strstr (par, "\n%%\n");
    if (tgt) {
      *tgt = '\0';
      tgt += 4;
    }
    g_free (put ("text.en", par, strlen (par)));
    g_free (put ("text.fr", tgt ? tgt : "", tgt ? strlen (tgt) : 0));
    prefix = path_of ("text");
  } else {
    static gboolean written;
    if (!written) {
      const char *en = "the cat sat .\na dog ran .\n", *fr = "le chat assis .\nun chien courait .\n";
      g_free (put ("par.en", en, strlen (en)));
      g_free (put ("par.fr", fr, strlen (fr)));
      written = TRUE;
    }
    prefix = path_of ("par");
  }
  char *p = put ("lexicon.tsv", lex, strlen (lex));
  char *cfg = g_strdup_printf ("plugin = \"nmt\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; src_vocab = 8; "
                               "tgt_vocab = 7; tokenize = \"simple\"; lexicon = \"%s\"; translate = true; "
                               "decode_lexicon = \"%s\";", prefix, prefix, prefix, p, p);
  run_task ("nmt", cfg);
  g_free (cfg);
  g_free (p);
  g_free (prefix);
  g_free (lex);
  return 0;
}

/* A run folder's saved vocabularies: vocab.txt, then "\n%%\n", src_vocab.txt,
 * "\n%%\n" and tgt_vocab.txt. cnndm (vocab.txt) and headline (the other two)
 * read them to decode raw text, reading no split; lm evaluates its splits
 * with vocab.txt. */
static int
psm_fuzz_saved_vocab (const uint8_t *d, size_t n)
{
  static char *text;
  if (!text) {
    const char *s = "the cat sat on the mat .\na dog ran <unk> .\n";
    text = put ("text.txt", s, strlen (s));
  }
  char *rest;
  char *v = split_input (d, n, &rest);
  char *tgt = rest ? strstr (rest, "\n%%\n") : NULL;
  if (tgt) {
    *tgt = '\0';
    tgt += 4;
  }
  g_free (put ("vocab.txt", v, strlen (v)));
  g_free (put ("src_vocab.txt", rest ? rest : "", rest ? strlen (rest) : 0));
  g_free (put ("tgt_vocab.txt", tgt ? tgt : "", tgt ? strlen (tgt) : 0));
  char *cfg = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 10; max_src = 8; "
                               "max_tgt = 4;", text, text);
  run_task_in ("cnndm", cfg, dir, TRUE);
  g_free (cfg);
  cfg = g_strdup_printf ("plugin = \"headline\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; src_vocab = 12; "
                         "tgt_vocab = 8; lvt = 6; max_src = 8; max_tgt = 4;", text, text, text);
  run_task_in ("headline", cfg, dir, TRUE);
  g_free (cfg);
  cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; bptt = 3;", text, text,
                         text);
  run_task_in ("lm", cfg, dir, FALSE);
  g_free (cfg);
  g_free (v);
  return 0;
}

/* psm-run view: a decoded record (one --json line) checked, then with its
 * per-example ROUGE added (the rouge plugin, when on the path). */
static int
psm_fuzz_view_record (const uint8_t *d, size_t n)
{
  static PsmRougeScorer *rouge;
  static gboolean tried;
  if (!tried) {
    rouge = psm_rouge_scorer_new ();
    tried = TRUE;
  }
  char *line = g_strndup ((const char *) d, n), *why = NULL;
  double sum[3] = { 0, 0, 0 };
  int k = 0;
  char *rec = psm_view_record (line, rouge, sum, &k, &why);
  if (rec) {
    char *again = psm_view_record (rec, NULL, sum, &k, &why);   /* the page's record is a record still */
    if (!again)
      abort ();
    g_free (again);
    g_free (rec);
  }
  g_free (why);
  g_free (line);
  return 0;
}

/* psm-run convert: the first byte picks the format (See's .bin, JSON lines,
 * CSV), the rest is the file; every record written must be one the cnndm
 * task reads (a JSON object with a non-empty article and summary). */
static int
psm_fuzz_convert (const uint8_t *d, size_t n)
{
  static const char *const formats[] = { "see-bin", "jsonl", "csv" };
  if (n < 1)
    return 0;
  FILE *in = fmemopen ((void *) (d + 1), n - 1, "rb");
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream (&buf, &len);
  if (!in && n > 1)
    abort ();
  GError *e = NULL;
  long records = 0;
  if (in)
    psm_convert_stream (in, "fuzz", formats[d[0] % 3], out, &records, &e);
  g_clear_error (&e);
  if (in)
    fclose (in);
  fclose (out);
  static const char *const keys[] = { "article", "highlights", NULL };
  GString *v[2] = { g_string_new (NULL), g_string_new (NULL) }, *why = g_string_new (NULL);
  char **lines = g_strsplit (buf ? buf : "", "\n", -1);
  long seen = 0;
  for (int i = 0; lines[i]; i++) {
    guint found;
    if (!*lines[i])
      continue;
    if (!psm_json_string_fields (lines[i], keys, v, &found, why) || found != 3 || !v[0]->len || !v[1]->len)
      abort ();
    seen++;
  }
  if (seen != records)
    abort ();
  g_strfreev (lines);
  g_string_free (v[0], TRUE);
  g_string_free (v[1], TRUE);
  g_string_free (why, TRUE);
  free (buf);
  return 0;
}

/* psm-run serve: the body of POST /summarize. What it accepts must be what
 * the decoder may take: a text with no blank ends or line breaks, settings
 * in range. */
static int
psm_fuzz_serve_request (const uint8_t *d, size_t n)
{
  const PsmDecodeSettings def = { 4, 35, 100 };
  PsmDecodeSettings ds;
  char *text = NULL, *why = NULL;
  if (psm_serve_parse_request ((const char *) d, n, &def, 64, 400, &text, &ds, &why)) {
    size_t len = strlen (text);
    if (why || !len || g_ascii_isspace (text[0]) || g_ascii_isspace (text[len - 1]) || strchr (text, '\n') ||
        ds.beam < 1 || ds.beam > 64 || ds.min_len < 0 || ds.max_len > 400 || ds.min_len > ds.max_len)
      abort ();
  } else if (!why || text) {
    abort ();
  }
  g_free (text);
  g_free (why);
  return 0;
}

const PsmFuzzTarget psm_fuzz_targets[] = {
  { "pipeline", psm_fuzz_pipeline },
  { "checkpoint", psm_fuzz_checkpoint },
  { "cnndm_jsonl", psm_fuzz_cnndm_jsonl },
  { "cnndm_lines", psm_fuzz_cnndm_lines },
  { "headline", psm_fuzz_headline },
  { "lm", psm_fuzz_lm },
  { "nmt", psm_fuzz_nmt },
  { "view_record", psm_fuzz_view_record },
  { "serve_request", psm_fuzz_serve_request },
  { "stream_state", psm_fuzz_stream_state },
  { "saved_vocab", psm_fuzz_saved_vocab },
  { "convert", psm_fuzz_convert },
  { NULL, NULL }
};
