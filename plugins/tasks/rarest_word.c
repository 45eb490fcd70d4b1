/* rarest_word — the synthetic task of Gulcehre et al. 2016, §5.1.
 *
 * Words w0..w(V-1) (ids 1..V; id 0 is <unk>) are drawn i.i.d. from a
 * truncated geometric unigram distribution P(w_k) ∝ (1 - p)^k, so w_k is
 * rarer than w_(k-1). A sequence has `length` words; its target is the least
 * frequent word in it (the largest k). Pointer targets: when the target is
 * one of the `pointer_words` rarest words, the switch is observed as 0
 * (point) and the target is its first location in the sequence; otherwise
 * it is 1 and the target is the word in the shortlist (the V - pointer_words
 * most frequent words plus <unk>). Training sequences are generated on the
 * fly from the run's RNG; validation and test sets are generated once, before
 * training, from their own fixed seeds, so every pipeline sees the same ones.
 * With unk_words = U the rarest U words are outside the input vocabulary:
 * the encoder reads <unk> for them (the paper does not say; see RESULTS.md),
 * while the source's extended ids, which a pointer copies, keep the word. */
#include <math.h>
#include <string.h>
#include <psm/psm.h>

typedef struct {
  int V, L, K;              /* words, length, pointer words */
  int U;                    /* the rarest U words read as <unk> */
  double p;
  double *cdf;              /* [V] */
  int n_eval[3];
  int32_t *eval[3];         /* [n, L] word indices (0-based k) */
  char **text;              /* [V + 1] */
} RarestWord;

static const PsmParamSpec params[] = {
  { "vocab", PSM_PARAM_INT, "600", 2, 1000000, "number of words |V|", NULL },
  { "length", PSM_PARAM_INT, "7", 1, 10000, "words per sequence", NULL },
  { "pointer_words", PSM_PARAM_INT, "60", 0, 1000000, "the rarest N words are targeted by location (0 = none)", NULL },
  { "unk_words", PSM_PARAM_INT, "0", 0, 1000000,
    "the rarest N words are outside the input vocabulary: the encoder reads them as <unk> (0 = none)", NULL },
  { "geometric_p", PSM_PARAM_FLOAT, "0.002", 1e-9, 0.999, "P(w_k) proportional to (1 - p)^k", NULL },
  { "valid_size", PSM_PARAM_INT, "2000", 1, 10000000, "validation sequences", NULL },
  { "test_size", PSM_PARAM_INT, "10000", 1, 10000000, "test sequences", NULL },
  { "valid_seed", PSM_PARAM_INT, "1001", 0, 2147483647, "seed of the validation set", NULL },
  { "test_seed", PSM_PARAM_INT, "1002", 0, 2147483647, "seed of the test set", NULL },
  PSM_PARAM_END
};

static int
sample_word (const RarestWord *t, PsmRng *rng)
{
  double u = psm_rng_uniform (rng);
  int lo = 0, hi = t->V - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (t->cdf[mid] > u)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

static void
generate (const RarestWord *t, PsmRng *rng, int32_t *seq)
{
  for (int i = 0; i < t->L; i++)
    seq[i] = sample_word (t, rng);
}

static void rw_destroy (void *self);

static void *
rw_create (const PsmSection *cfg, const PsmTaskCtx *ctx, GError **error)
{
  RarestWord *t = g_new0 (RarestWord, 1);
  t->V = (int) psm_section_int (cfg, "vocab");
  t->L = (int) psm_section_int (cfg, "length");
  t->K = (int) psm_section_int (cfg, "pointer_words");
  t->U = (int) psm_section_int (cfg, "unk_words");
  t->p = psm_section_float (cfg, "geometric_p");
  const char *too_big = t->K >= t->V ? "pointer_words" : t->U >= t->V ? "unk_words" : NULL;
  if (too_big) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: must be below task.vocab (%d)", psm_section_where (cfg, too_big), t->V);
    g_free (t);
    return NULL;
  }
  t->cdf = g_new (double, t->V);
  double s = 0.0;
  for (int k = 0; k < t->V; k++)
    s += pow (1.0 - t->p, k);
  double c = 0.0;
  for (int k = 0; k < t->V; k++) {
    c += pow (1.0 - t->p, k) / s;
    t->cdf[k] = c;
  }
  t->cdf[t->V - 1] = 1.0;
  t->text = g_new0 (char *, t->V + 2);   /* NULL-terminated */
  t->text[0] = g_strdup ("<unk>");
  for (int k = 0; k < t->V; k++)
    t->text[k + 1] = g_strdup_printf ("w%d", k);
  const char *sizes[3] = { NULL, "valid_size", "test_size" };
  const char *seeds[3] = { NULL, "valid_seed", "test_seed" };
  guint64 limit = psm_memory_limit ();
  for (int s2 = 1; s2 < 3; s2++) {
    int n = (int) psm_section_int (cfg, sizes[s2]);
    if (ctx->check)
      n = MIN (n, 64);
    guint64 bytes = (guint64) n * t->L * sizeof (int32_t);
    if (limit && bytes > limit / 2) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: %d sequences of %d words need %.1f GiB, more than half the memory this process may "
                   "use (%.1f GiB)", psm_section_where (cfg, sizes[s2]), n, t->L,
                   bytes / (1024.0 * 1024 * 1024), limit / (1024.0 * 1024 * 1024));
      rw_destroy (t);
      return NULL;
    }
    PsmRng rng;
    psm_rng_seed (&rng, (guint64) psm_section_int (cfg, seeds[s2]));
    t->n_eval[s2] = n;
    t->eval[s2] = g_new (int32_t, (size_t) n * t->L);
    for (int i = 0; i < n; i++)
      generate (t, &rng, t->eval[s2] + (size_t) i * t->L);
  }
  return t;
}

static void
rw_destroy (void *self)
{
  RarestWord *t = self;
  g_free (t->cdf);
  for (int s = 1; s < 3; s++)
    g_free (t->eval[s]);
  g_strfreev (t->text);
  g_free (t);
}

static void
rw_info (void *self, PsmTaskInfo *info)
{
  RarestWord *t = self;
  info->src_vocab = t->V + 1;
  info->tgt_vocab = t->V - t->K + 1;   /* <unk> + the shortlist words */
  info->ext_base = t->V + 1;
  info->max_src_len = t->L;
  info->max_tgt_len = 1;
  info->bos_id = -1;
  info->eos_id = -1;
  info->unk_id = 0;
}

/* Fills column b of the batch from one sequence of word indices. */
static void
fill (const RarestWord *t, PsmBatch *out, int b, const int32_t *seq)
{
  int best = 0;
  for (int i = 0; i < t->L; i++) {
    PSM_AT (out->src, out, i, b) = seq[i] >= t->V - t->U ? 0 : seq[i] + 1;
    PSM_AT (out->src_ext, out, i, b) = seq[i] + 1;   /* what a pointer copies */
    PSM_AT (out->src_mask, out, i, b) = 1.0f;
    if (seq[i] > seq[best])
      best = i;   /* first occurrence of the rarest word */
  }
  int k = seq[best];
  gboolean point = k >= t->V - t->K;
  out->tgt_ext[b] = k + 1;
  out->tgt[b] = point ? 0 : k + 1;
  out->tgt_mask[b] = 1.0f;
  out->tgt_switch[b] = point ? 0.0f : 1.0f;
  out->tgt_loc[b] = point ? best : -1;
  out->dec_in[b] = 0;
}

static gboolean
rw_train_batch (void *self, int B, PsmRng *rng, PsmBatch *out, GError **error)
{
  RarestWord *t = self;
  psm_batch_reserve (out, B, t->L, 1);
  out->ext_base = t->V + 1;
  int32_t *seq = g_newa (int32_t, t->L);
  for (int b = 0; b < B; b++) {
    generate (t, rng, seq);
    fill (t, out, b, seq);
  }
  return TRUE;
}

static int
rw_n_examples (void *self, PsmSplit split)
{
  RarestWord *t = self;
  return split == PSM_SPLIT_TRAIN ? 0 : t->n_eval[split];
}

static gboolean
rw_eval_batch (void *self, PsmSplit split, int start, int B, PsmBatch *out, GError **error)
{
  RarestWord *t = self;
  g_return_val_if_fail (split != PSM_SPLIT_TRAIN, FALSE);
  B = MAX (0, MIN (B, t->n_eval[split] - start));
  psm_batch_reserve (out, B, t->L, 1);
  out->ext_base = t->V + 1;
  for (int b = 0; b < B; b++) {
    fill (t, out, b, t->eval[split] + (size_t) (start + b) * t->L);
    out->example_id[b] = start + b;
  }
  return TRUE;
}

static const char *
rw_token_text (void *self, const PsmBatch *batch, int b, int32_t id)
{
  RarestWord *t = self;
  return id >= 0 && id <= t->V ? t->text[id] : "<bad-id>";
}

static const PsmTaskClass klass = {
  .size = sizeof (PsmTaskClass),
  .create = rw_create,
  .destroy = rw_destroy,
  .info = rw_info,
  .train_batch = rw_train_batch,
  .n_examples = rw_n_examples,
  .eval_batch = rw_eval_batch,
  .token_text = rw_token_text,
};

PSM_PLUGIN (PSM_KIND_TASK, "rarest_word",
            "Gulcehre et al. 2016 §5.1: predict the least frequent word of a geometric-unigram sequence",
            params, NULL, &klass)
