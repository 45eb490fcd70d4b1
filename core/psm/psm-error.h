/* psm-error.h — psm's three error domains (GError), one header for every
 * layer and plugin that reports or tells apart an error. psm-run maps them
 * to exit statuses: a configuration or plugin error is a usage error
 * (exit 2), a run error says its own (psm-run(1), EXIT STATUS). */
#ifndef PSM_ERROR_H
#define PSM_ERROR_H
#include <glib.h>
G_BEGIN_DECLS

/* A pipeline file, a --set or a plugin's section: "FILE:LINE: path.key: ..."
 * (all problems, one a line). */
GQuark psm_config_error_quark (void);
#define PSM_CONFIG_ERROR psm_config_error_quark ()
typedef enum { PSM_CONFIG_ERROR_INVALID } PsmConfigError;

/* Loading a plugin: not found, not a psm plugin, wrong ABI, bad class. */
GQuark psm_plugin_error_quark (void);
#define PSM_PLUGIN_ERROR psm_plugin_error_quark ()
typedef enum {
  PSM_PLUGIN_ERROR_NOT_FOUND,
  PSM_PLUGIN_ERROR_OPEN,       /* dlopen failed (not a shared object, ...) */
  PSM_PLUGIN_ERROR_NO_ENTRY,   /* not a psm plugin */
  PSM_PLUGIN_ERROR_ABI,        /* wrong ABI version or struct size */
  PSM_PLUGIN_ERROR_KIND,       /* bad or unexpected kind, or name mismatch */
  PSM_PLUGIN_ERROR_INIT,       /* init() failed */
  PSM_PLUGIN_ERROR_DUPLICATE,  /* kind/name already loaded from another file */
  PSM_PLUGIN_ERROR_CLASS       /* a required class hook is NULL, or the
                                  parameter table is malformed */
} PsmPluginError;

/* Running: usage (the run folder already holds a run), failures (NaN
 * loss, I/O, data), cancellation. */
GQuark psm_run_error_quark (void);
#define PSM_RUN_ERROR psm_run_error_quark ()
typedef enum {
  PSM_RUN_ERROR_USAGE,     /* exit 2: e.g. run folder already holds a run */
  PSM_RUN_ERROR_FAILED,    /* exit 1: NaN loss, I/O, data */
  PSM_RUN_ERROR_CANCELLED  /* PsmEvalOptions.cancelled said so */
} PsmRunError;

G_END_DECLS
#endif
