/* Per-op timing of a backend (STRATA_PROFILE=1): backend_prof_wrap returns a
 * backend that forwards every op to `in`, waits for the device after each,
 * and counts calls and wall time per op; destroying it logs the table and
 * destroys `in`. For finding which ops dominate a step, not for its speed
 * (waiting after each op removes all overlap, and steps are not recorded). */
#ifndef STRATA_BACKEND_BACKEND_PROF_H
#define STRATA_BACKEND_BACKEND_PROF_H

#include <stddef.h>

#include "backend/backend.h"

st_backend *backend_prof_wrap(st_backend *in);
/* The table so far: op, calls, total ms, mean us, share, largest first. */
void backend_prof_report(st_backend *be, char *buf, size_t cap);

#endif
