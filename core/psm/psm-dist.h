/* psm-dist.h — data parallelism over MPI (core/base/psm-dist.c; part of
 * psm-pipeline.h's API, ABI 1.21) */
#ifndef PSM_DIST_H
#define PSM_DIST_H
#include <glib.h>
G_BEGIN_DECLS

/* Joins the MPI job when the process was started by mpirun (or another
 * launcher that says so in the environment); otherwise one rank of one.
 * Without MPI support, refuses a start as one of several ranks. */
gboolean psm_dist_init (int *argc, char ***argv, GError **error);
int psm_dist_rank (void);
int psm_dist_size (void);
void psm_dist_finalize (void);
/* Ends every rank of the job with code (one rank's error must not leave
 * the others waiting in a collective); returns only on one rank. */
void psm_dist_abort (int code);

G_END_DECLS
#endif
