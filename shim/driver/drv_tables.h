/* The tables hack/gen_shim_tables.py --driver generates into drv_gen.c and drv_errors.c (which
 * include no CUDA header: its stubs are declared (void), as the runtime shim's are). */
#ifndef PILOT_DRV_TABLES_H
#define PILOT_DRV_TABLES_H

#include <stddef.h>

struct pilot_drv_proc {
    const char *name;
    void *fn;
};
struct pilot_drv_alias {
    const char *base;       /* the name programs ask cuGetProcAddress for */
    const char *dflt;       /* the export it means (NULL: none) */
    const char *per_thread; /* the same with per-thread default stream semantics */
};
extern const struct pilot_drv_proc pilot_drv_procs[]; /* every export, sorted by name */
extern const size_t pilot_drv_proc_count;
extern const struct pilot_drv_alias pilot_drv_aliases[]; /* sorted by base */
extern const size_t pilot_drv_alias_count;
/* drv_gen.c hands its tables to cuGetProcAddress (drv_core.c) from a constructor. */
void pilot_drv_register_tables(const struct pilot_drv_proc *procs, size_t proc_count,
                               const struct pilot_drv_alias *aliases, size_t alias_count);
/* drv_errors.c: CUresult -> "CUDA_ERROR_..."; NULL if none. */
const char *pilot_drv_error_name(int code);

#endif
