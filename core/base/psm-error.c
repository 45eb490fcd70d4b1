/* psm-error.c — the three error domains of psm/psm-error.h, defined at the
 * bottom layer so that every layer above can report in them. */
#include "config.h"
#include "psm/psm-error.h"

G_DEFINE_QUARK (psm-config-error-quark, psm_config_error)
G_DEFINE_QUARK (psm-plugin-error-quark, psm_plugin_error)
G_DEFINE_QUARK (psm-run-error-quark, psm_run_error)
