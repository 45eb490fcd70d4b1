/* psm-config.h — declared parameters of a component and validated access to
 * its section of a pipeline file (libconfig).
 *
 * Every component (plugin or core section) declares a table of PsmParamSpec,
 * terminated by an entry with name == NULL. psm validates pipeline files
 * strictly against these tables, `psm-run --list` prints them, and the
 * accessors below return the configured value or the declared default. */
#ifndef PSM_CONFIG_H
#define PSM_CONFIG_H
#include <glib.h>
#include "psm-error.h"
G_BEGIN_DECLS

typedef enum {
  PSM_PARAM_INT,
  PSM_PARAM_FLOAT,     /* integers are accepted and converted */
  PSM_PARAM_BOOL,
  PSM_PARAM_STRING,
  PSM_PARAM_CHOICE,    /* a string from `choices` ("a|b|c") */
  PSM_PARAM_FILE       /* a string naming a file that must exist */
} PsmParamType;

typedef struct {
  const char *name;
  PsmParamType type;
  const char *def;       /* default as text; NULL = required */
  double min, max;       /* inclusive range for INT/FLOAT; min > max = none */
  const char *doc;       /* one line */
  const char *choices;   /* CHOICE only */
} PsmParamSpec;

#define PSM_NO_RANGE 1.0, 0.0
#define PSM_PARAM_END { NULL, 0, NULL, 0, 0, NULL, NULL }

/* Allowed values of a parameter as text: "[min, max]" for a ranged INT or
 * FLOAT, the choices ("a|b") for a CHOICE, "" otherwise. Free with g_free. */
char *psm_param_range (const PsmParamSpec *p);
/* "int", "float", "bool", "string", "choice" or "file". */
const char *psm_param_type_name (PsmParamType t);

/* A validated section: a spec plus the libconfig group it was read from. */
typedef struct PsmSection PsmSection;

gint64 psm_section_int (const PsmSection *s, const char *name);
double psm_section_float (const PsmSection *s, const char *name);
gboolean psm_section_bool (const PsmSection *s, const char *name);
const char *psm_section_string (const PsmSection *s, const char *name);  /* owned by s */
/* "file:line: path" of a key, for errors found after validation (semantic
 * checks inside a component). Owned by s; valid until the next call. */
const char *psm_section_where (const PsmSection *s, const char *name);
const char *psm_section_path (const PsmSection *s);   /* e.g. "model.head" */
const PsmParamSpec *psm_section_spec (const PsmSection *s);

/* A section read from text, the inside of a group ("hidden = 8; ..."),
 * validated against spec as a pipeline file's group at path would be (an
 * unknown key, a wrong type or a value out of range is an error naming
 * "FILE:LINE: path.key"; file names the text in messages). For tests of
 * plugins (ABI 1.9). Free it with psm_section_destroy. */
PsmSection *psm_section_from_text (const char *text, const char *file, const char *path, const PsmParamSpec *spec,
                                   GError **error);
void psm_section_destroy (PsmSection *s);


G_END_DECLS
#endif
