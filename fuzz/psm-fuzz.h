/* psm-fuzz.h — psm's fuzz targets (fuzz/psm-fuzz.c). */
#ifndef PSM_FUZZ_H
#define PSM_FUZZ_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *name;   /* also the corpus folder: fuzz/corpus/NAME */
  int (*run) (const uint8_t *data, size_t size);
} PsmFuzzTarget;

extern const PsmFuzzTarget psm_fuzz_targets[];   /* NULL-name ended */
/* A valid checkpoint of the checkpoint target's model (a seed). */
void psm_fuzz_write_checkpoint_seed (const char *path);
/* A valid training-stream state of the stream_state target's model (a seed). */
void psm_fuzz_write_stream_state_seed (const char *path);
#endif
