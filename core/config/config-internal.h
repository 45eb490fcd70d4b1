/* config-internal.h — the config layer (core/config/): a section's
 * internals, @include expansion and the integer scan shared by the
 * pipeline reader, the loader's. */
#ifndef PSM_CONFIG_INTERNAL_H
#define PSM_CONFIG_INTERNAL_H
#include <libconfig.h>
#include "base/base-internal.h"

struct PsmSection {
  const PsmParamSpec *spec;
  config_setting_t *setting;   /* the group; NULL when absent (all defaults) */
  char *path;                  /* "model.head" */
  char *file;                  /* pipeline file, for messages */
  char *where;                 /* buffer for psm_section_where */
  config_t *owned;             /* psm_section_from_text's parse, freed with it */
};

PsmSection *psm_section_new (const PsmParamSpec *spec, config_setting_t *setting,
                             const char *path, const char *file);
void psm_section_free (PsmSection *s);
/* "FILE:LINE: path" for a setting (or "--set path" for one made by --set). */
char *psm_setting_where (const char *file, config_setting_t *s, const char *path);
/* Validates the keys of group against spec; appends messages to errors.
 * extra: keys handled elsewhere (NULL-terminated) that are allowed. */
void psm_validate_group (const char *file, config_setting_t *group, const char *path,
                         const PsmParamSpec *spec, const char *const *extra, GPtrArray *errors);
/* Applies "a.b.c=value" to cfg; FALSE with error on a malformed override. */
gboolean psm_config_apply_set (config_t *cfg, const char *assignment, GError **error);
/* A pipeline's text with its @include directives expanded, each path
 * relative to the file that holds it (psm-include.c), and the map from
 * the text's lines back to files and lines; NULL with error. The map is
 * set as the hook of the config's root setting, where psm_setting_where
 * finds it. */
typedef struct PsmLineMap PsmLineMap;
char *psm_config_expand (const char *file, PsmLineMap **map, GError **error);
/* The file and line of the expanded text's line (1-based); FALSE outside. */
gboolean psm_line_map_where (const PsmLineMap *m, int line, const char **file, int *at);
void psm_line_map_free (PsmLineMap *m);
/* Appends "FILE:LINE: key.path: ..." for every integer literal of a
 * pipeline's expanded text (file: the pipeline, for lines outside lines'
 * map) that libconfig would wrap to 32 bits (psm-intscan.c). */
void psm_config_scan_integers (const char *file, const char *text, const PsmLineMap *lines, GPtrArray *errors);
#endif
