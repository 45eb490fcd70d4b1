/* psm-decode.c — beam search (greedy is beam 1) over any scorer.
 *
 * Article b owns rows [b K, (b + 1) K) of every step; at the first step only
 * row b K is live. Each step the scorer sees, for every row, the row of the
 * previous step it continues (the caller reorders its carry with that row
 * gather) and the slot it emitted, and returns log-scores of S slots for the
 * rows asked for: those of the articles still searching, and at the first
 * step only their row b K (a scorer that scored every row did K times the
 * first step's work and went on scoring articles that had finished). Per
 * article, the 2K best extensions of the live rows by summed log-score are
 * taken in order: one ending in EOS (allowed from min_len tokens on, the EOS
 * counted) becomes a finished hypothesis, the others fill the K rows of the
 * next step. An article stops when it has K finished hypotheses (See et
 * al.'s rule) or at max_len, where its live rows count as finished. The
 * result is the finished hypothesis with the best logp / len^alpha (alpha =
 * length_penalty; 1 is See et al.'s average log-probability, 0 the sum).
 * Optional: never emit the unknown word; never repeat an n-gram of words. */
#include "config.h"
#include <math.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "model/model-internal.h"

typedef struct {
  double v;
  int row;
  int32_t slot;
} Cand;

typedef struct {
  int K, L, n;
  int32_t *slots, *rows;    /* [n, L] history of each row */
  double *logp;
  int *len;
  gboolean *alive;
} Beam;

static void
beam_alloc (Beam *b, int n, int K, int L)
{
  b->K = K;
  b->L = L;
  b->n = n;
  b->slots = g_new0 (int32_t, (size_t) n * L);
  b->rows = g_new0 (int32_t, (size_t) n * L);
  b->logp = g_new0 (double, n);
  b->len = g_new0 (int, n);
  b->alive = g_new0 (gboolean, n);
}

static void
beam_free (Beam *b)
{
  g_free (b->slots);
  g_free (b->rows);
  g_free (b->logp);
  g_free (b->len);
  g_free (b->alive);
}

static int32_t
word_of (const PsmBeamFns *f, int row, int32_t slot)
{
  return f->word ? f->word (f->ud, row, slot) : slot;
}

/* Would appending w to row's history repeat one of its n-grams? */
static gboolean
repeats_ngram (const PsmBeamFns *f, const Beam *bm, int row, int32_t w, int ng, int32_t *buf)
{
  int len = bm->len[row];
  if (ng <= 0 || len + 1 < ng)
    return FALSE;
  const int32_t *h = bm->slots + (size_t) row * bm->L;
  const int32_t *hr = bm->rows + (size_t) row * bm->L;
  for (int i = 0; i < len; i++)
    buf[i] = word_of (f, hr[i], h[i]);
  buf[len] = w;
  const int32_t *last = buf + len + 1 - ng;
  for (int i = 0; i + ng <= len; i++)
    if (memcmp (buf + i, last, ng * sizeof (int32_t)) == 0)
      return TRUE;
  return FALSE;
}

static void
hyp_set (PsmHyp *h, const Beam *bm, int row, int32_t slot, int step_row, double logp, int len, double alpha)
{
  int n = bm->len[row];
  g_free (h->slots);
  g_free (h->rows);
  h->slots = g_new (int32_t, n + 1);
  h->rows = g_new (int32_t, n + 1);
  memcpy (h->slots, bm->slots + (size_t) row * bm->L, n * sizeof (int32_t));
  memcpy (h->rows, bm->rows + (size_t) row * bm->L, n * sizeof (int32_t));
  h->len = n;
  if (slot >= 0) {
    h->slots[n] = slot;
    h->rows[n] = step_row;
    h->len = n + 1;
  }
  h->logp = logp;
  h->score = logp / (alpha > 0 ? pow (MAX (len, 1), alpha) : 1.0);
}

void
psm_hyp_clear (PsmHyp *h)
{
  g_free (h->slots);
  g_free (h->rows);
  memset (h, 0, sizeof *h);
}

/* Inserts c into the descending list top[0..*k) of capacity cap. */
static void
push_cand (Cand *top, int *k, int cap, Cand c)
{
  if (*k == cap && c.v <= top[cap - 1].v)
    return;
  int i = *k < cap ? (*k)++ : cap - 1;
  while (i > 0 && top[i - 1].v < c.v) {
    top[i] = top[i - 1];
    i--;
  }
  top[i] = c;
}

long psm_beam_rows;

/* A float below which a row's score x cannot make logp + x (in double)
 * beat the list's last entry `last`: (float) (last - logp) is within half
 * a float ulp of the real difference, one ulp lower is below it by far
 * more than the double sum's rounding. -inf (test everything) where that
 * is not a finite number. Skipping the entries at or below it, most of a
 * row once the list is full, changes no result. */
float
psm_beam_score_floor (double last, double logp)
{
  double d = last - logp;
  if (!isfinite (d) || fabs (d) > 1e30)
    return -INFINITY;
  return nextafterf ((float) d, -INFINITY);
}

/* The first s in [from, S) with row[s] > bar (NaN never is), or S. */
static int32_t
next_above (const float *row, int32_t from, int32_t S, float bar)
{
  int32_t s = from;
#ifdef __AVX512F__
  __m512 f = _mm512_set1_ps (bar);
  for (; s + 16 <= S; s += 16) {
    __mmask16 m = _mm512_cmp_ps_mask (_mm512_loadu_ps (row + s), f, _CMP_GT_OQ);
    if (m)
      return s + __builtin_ctz (m);
  }
#endif
  for (; s < S; s++)
    if (row[s] > bar)
      return s;
  return S;
}

gboolean
psm_beam_search (const PsmBeamConfig *cfg, int B, const PsmBeamFns *f, PsmHyp *out, GError **error)
{
  int K = MAX (cfg->beam, 1), L = MAX (cfg->max_len, 1), n = B * K, cap = 2 * K;
  double alpha = cfg->length_penalty;
  Beam cur, nxt;
  beam_alloc (&cur, n, K, L);
  beam_alloc (&nxt, n, K, L);
  int32_t *parents = g_new0 (int32_t, n), *tokens = g_new (int32_t, n), *buf = g_new (int32_t, L + 1);
  Cand *top = g_new (Cand, cap);
  int *n_fin = g_new0 (int, B);
  gboolean *done = g_new0 (gboolean, B);
  int *act = g_new (int, B), *base = g_new (int, B);
  /* finished hypotheses: K per article, kept best first by score */
  PsmHyp *fin = g_new0 (PsmHyp, (size_t) B * K);
  for (int b = 0; b < B; b++)
    cur.alive[b * K] = TRUE;
  for (int i = 0; i < n; i++)
    tokens[i] = -1;
  gboolean ok = TRUE;
  int live_articles = B;
  for (int t = 0; t < L && live_articles > 0; t++) {
    int S = 0, n_act = 0, per = t || !psm_paths.beam_skip_rows ? K : 1;
    for (int b = 0; b < B; b++)
      if (!done[b] || !psm_paths.beam_skip_rows)
        act[n_act++] = b;
    __atomic_add_fetch (&psm_beam_rows, (long) n_act * per, __ATOMIC_RELAXED);
    const float *sc = f->step (f->ud, n, t ? parents : NULL, tokens, act, n_act, per, base, &S, error);
    if (!sc) {
      ok = FALSE;
      break;
    }
    memset (nxt.alive, 0, n * sizeof (gboolean));
    for (int b = 0; b < B; b++) {
      if (done[b])
        continue;
      int k = 0;
      for (int r = b * K; r < (b + 1) * K; r++) {
        if (!cur.alive[r])
          continue;
        const float *row = sc + (size_t) (base[b] + r - b * K) * S;
        float bar = k == cap && psm_paths.beam_floor ? psm_beam_score_floor (top[cap - 1].v, cur.logp[r]) : -INFINITY;
        for (int32_t s = next_above (row, 0, S, bar); s < S; s = next_above (row, s + 1, S, bar)) {
          if (!isfinite (row[s]))
            continue;
          Cand c = { cur.logp[r] + row[s], r, s };
          if (k == cap && c.v <= top[cap - 1].v)
            continue;
          if (s == cfg->eos ? t + 1 < cfg->min_len : FALSE)
            continue;
          int32_t w = s == cfg->eos ? -1 : word_of (f, r, s);
          if (cfg->no_unk && cfg->unk >= 0 && w == cfg->unk)
            continue;
          if (w >= 0 && repeats_ngram (f, &cur, r, w, cfg->block_ngram, buf))
            continue;
          push_cand (top, &k, cap, c);
          if (k == cap && psm_paths.beam_floor)
            bar = psm_beam_score_floor (top[cap - 1].v, cur.logp[r]);
        }
      }
      int filled = 0;
      for (int i = 0; i < k && n_fin[b] < K && filled < K; i++) {
        const Cand *c = &top[i];
        if (c->slot == cfg->eos) {
          PsmHyp *h = &fin[(size_t) b * K + n_fin[b]++];
          hyp_set (h, &cur, c->row, -1, c->row, c->v, t + 1, alpha);
          continue;
        }
        int r = b * K + filled++;
        int m = cur.len[c->row];
        memcpy (nxt.slots + (size_t) r * L, cur.slots + (size_t) c->row * L, m * sizeof (int32_t));
        memcpy (nxt.rows + (size_t) r * L, cur.rows + (size_t) c->row * L, m * sizeof (int32_t));
        nxt.slots[(size_t) r * L + m] = c->slot;
        nxt.rows[(size_t) r * L + m] = c->row;
        nxt.len[r] = m + 1;
        nxt.logp[r] = c->v;
        nxt.alive[r] = TRUE;
        parents[r] = c->row;
        tokens[r] = c->slot;
      }
      for (int r = b * K + filled; r < (b + 1) * K; r++) {
        parents[r] = b * K;
        tokens[r] = -1;
      }
      gboolean last = t + 1 == L;
      if (last)
        for (int r = b * K; r < b * K + filled && n_fin[b] < K; r++)
          hyp_set (&fin[(size_t) b * K + n_fin[b]++], &nxt, r, -1, r, nxt.logp[r], nxt.len[r], alpha);
      if (n_fin[b] >= K || filled == 0 || last) {
        done[b] = TRUE;
        live_articles--;
        for (int r = b * K; r < (b + 1) * K; r++)
          nxt.alive[r] = FALSE;
      }
    }
    /* dead rows keep a valid parent and token for the scorer */
    for (int b = 0; b < B; b++)
      if (done[b])
        for (int r = b * K; r < (b + 1) * K; r++) {
          parents[r] = r;
          tokens[r] = -1;
        }
    Beam tmp = cur;
    cur = nxt;
    nxt = tmp;
  }
  for (int b = 0; b < B && ok; b++) {
    int best = -1;
    for (int i = 0; i < n_fin[b]; i++)
      if (best < 0 || fin[(size_t) b * K + i].score > fin[(size_t) b * K + best].score)
        best = i;
    psm_hyp_clear (&out[b]);
    if (best >= 0) {
      out[b] = fin[(size_t) b * K + best];
      memset (&fin[(size_t) b * K + best], 0, sizeof (PsmHyp));
    } else {
      out[b].score = out[b].logp = -INFINITY;
    }
  }
  for (int i = 0; i < B * K; i++)
    psm_hyp_clear (&fin[i]);
  g_free (fin);
  g_free (done);
  g_free (act);
  g_free (base);
  g_free (n_fin);
  g_free (top);
  g_free (buf);
  g_free (tokens);
  g_free (parents);
  beam_free (&cur);
  beam_free (&nxt);
  return ok;
}
