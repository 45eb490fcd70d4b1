/* psm-arena.c — the arena a graph's tensors live in: blocks of 64-byte
 * aligned memory handed out in order and taken back all at once by a reset
 * (which merges several blocks into one, so that a step of the same size
 * next time allocates nothing). */
#include "config.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "tape/tape-internal.h"

typedef struct Block {
  struct Block *next;
  size_t size, used;
  char *mem;
} Block;

struct PsmArena {
  Block *head;     /* current block first */
  size_t total;    /* sum of block sizes */
};

static Block *
block_new (size_t size)
{
  Block *b = g_new0 (Block, 1);
  b->size = size;
  b->mem = psm_xaligned (size, "a block of a step's tensors");
  return b;
}

PsmArena *
psm_arena_new (size_t initial_bytes)
{
  PsmArena *a = g_new0 (PsmArena, 1);
  a->head = block_new (MAX (initial_bytes, 1 << 16));
  a->total = a->head->size;
  return a;
}

void *
psm_arena_alloc (PsmArena *a, size_t bytes)
{
  bytes = (bytes + 63) & ~(size_t) 63;
  if (a->head->used + bytes > a->head->size) {
    Block *b = block_new (MAX (bytes, a->head->size * 2));
    b->next = a->head;
    a->head = b;
    a->total += b->size;
  }
  void *p = a->head->mem + a->head->used;
  a->head->used += bytes;
  return p;
}

/* Zeroed: a large block (a step's gradient buffers of several MB: the
 * encoder's input projection, the annotations, the batch-major copies) by
 * both threads, in 1 MB pieces. */
void *
psm_arena_alloc0 (PsmArena *a, size_t bytes)
{
  char *p = psm_arena_alloc (a, bytes);
  if (bytes >= ((size_t) 4 << 20) && !omp_in_parallel ()) {
    size_t piece = (size_t) 1 << 20, n = (bytes + piece - 1) / piece;
#pragma omp parallel for schedule (static)
    for (size_t i = 0; i < n; i++)
      memset (p + i * piece, 0, MIN (piece, bytes - i * piece));
  } else {
    memset (p, 0, bytes);
  }
  return p;
}

size_t
psm_arena_used (const PsmArena *a)
{
  size_t u = 0;
  for (Block *b = a->head; b; b = b->next)
    u += b->used;
  return u;
}

void
psm_arena_reset (PsmArena *a)
{
  if (a->head->next) {
    /* Several blocks: replace them by one that holds everything, so the
     * next step of the same size needs no allocation. */
    size_t total = a->total;
    for (Block *b = a->head; b;) {
      Block *n = b->next;
      free (b->mem);
      g_free (b);
      b = n;
    }
    a->head = block_new (total);
    a->total = total;
  }
  a->head->used = 0;
}

void
psm_arena_free (PsmArena *a)
{
  if (!a)
    return;
  for (Block *b = a->head; b;) {
    Block *n = b->next;
    free (b->mem);
    g_free (b);
    b = n;
  }
  g_free (a);
}

