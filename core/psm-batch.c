/* psm-batch.c — batch buffers, grown on demand and reused. */
#include "config.h"
#include <string.h>
#include "psm/psm-batch.h"

void
psm_batch_init (PsmBatch *b)
{
  memset (b, 0, sizeof *b);
  b->size = sizeof *b;
}

void
psm_batch_reserve (PsmBatch *b, int B, int T, int Ty)
{
  if (B > b->cap_B || T * B > b->cap_T * b->cap_B || Ty * B > b->cap_Ty * b->cap_B) {
    int cB = MAX (B, b->cap_B), cT = MAX (T, b->cap_T), cTy = MAX (Ty, b->cap_Ty);
    size_t ns = (size_t) cB * cT, nt = (size_t) cB * cTy;
    b->src = g_renew (int32_t, b->src, ns);
    b->src_ext = g_renew (int32_t, b->src_ext, ns);
    b->src_mask = g_renew (float, b->src_mask, ns);
    b->dec_in = g_renew (int32_t, b->dec_in, nt);
    b->tgt = g_renew (int32_t, b->tgt, nt);
    b->tgt_ext = g_renew (int32_t, b->tgt_ext, nt);
    b->tgt_mask = g_renew (float, b->tgt_mask, nt);
    b->tgt_switch = g_renew (float, b->tgt_switch, nt);
    b->tgt_loc = g_renew (int32_t, b->tgt_loc, nt);
    b->example_id = g_renew (int32_t, b->example_id, cB);
    b->cap_B = cB;
    b->cap_T = cT;
    b->cap_Ty = cTy;
  }
  b->B = B;
  b->T = T;
  b->Ty = Ty;
  size_t ns = (size_t) B * T, nt = (size_t) B * Ty;
  memset (b->src, 0, ns * sizeof *b->src);
  memset (b->src_ext, 0, ns * sizeof *b->src_ext);
  memset (b->src_mask, 0, ns * sizeof *b->src_mask);
  memset (b->dec_in, 0, nt * sizeof *b->dec_in);
  memset (b->tgt, 0, nt * sizeof *b->tgt);
  memset (b->tgt_ext, 0, nt * sizeof *b->tgt_ext);
  memset (b->tgt_mask, 0, nt * sizeof *b->tgt_mask);
  memset (b->tgt_switch, 0, nt * sizeof *b->tgt_switch);
  for (size_t i = 0; i < nt; i++)
    b->tgt_loc[i] = -1;
  for (int i = 0; i < B; i++)
    b->example_id[i] = -1;
  if (b->oov_words)
    g_ptr_array_set_size (b->oov_words, 0);
  b->ext_base = 0;
}

void
psm_batch_clear (PsmBatch *b)
{
  g_free (b->src);
  g_free (b->src_ext);
  g_free (b->src_mask);
  g_free (b->dec_in);
  g_free (b->tgt);
  g_free (b->tgt_ext);
  g_free (b->tgt_mask);
  g_free (b->tgt_switch);
  g_free (b->tgt_loc);
  g_free (b->example_id);
  if (b->oov_words)
    g_ptr_array_unref (b->oov_words);
  psm_batch_init (b);
}
