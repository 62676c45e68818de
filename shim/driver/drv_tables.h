/* The tables hack/gen_shim_tables.py --driver generates into drv_gen.c (which includes no CUDA
 * header: its stubs are declared (void), as the runtime shim's are). */
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
const char *pilot_drv_error_name(int code); /* CUresult -> "CUDA_ERROR_..."; NULL if none */

#endif
