/* fuzz-main.c — libFuzzer's entry points: the target PSM_FUZZ_TARGET names
 * (fuzz/run.sh sets it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "psm-fuzz.h"

static const PsmFuzzTarget *target;

int LLVMFuzzerInitialize (int *argc, char ***argv);
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  const char *name = getenv ("PSM_FUZZ_TARGET");
  for (const PsmFuzzTarget *t = psm_fuzz_targets; name && t->name; t++)
    if (strcmp (t->name, name) == 0)
      target = t;
  if (!target) {
    fprintf (stderr, "psm-fuzz: set PSM_FUZZ_TARGET to one of:");
    for (const PsmFuzzTarget *t = psm_fuzz_targets; t->name; t++)
      fprintf (stderr, " %s", t->name);
    fprintf (stderr, "\n");
    exit (2);
  }
  /* once before fuzzing: the plugins are dlopen'ed now, so their
   * coverage counters are registered from the first input on */
  target->run ((const uint8_t *) "", 0);
  return 0;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  return target->run (data, size);
}
