/* A program whose CUDA runtime is linked statically (nvcc's default, -cudart static) never calls
 * the preloaded shim: its GPU work would run outside pilot unnoticed. pilot cannot carry it (the
 * static runtime needs the driver's private integrity check, which only NVIDIA's libcuda
 * computes: docs/design/frameworks.md section 10), so when the process starts and the executable
 * registers kernels with a runtime (nvcc's .nvFatBinSegment) but does not need libcudart.so, the
 * shim refuses it: one line on
 * stderr and exit status 3, as `pilot run` refuses it before it starts (cli/elf.py).
 * PILOT_STATIC_RUNTIME=warn lets it run, outside pilot, with the line as a warning.
 *
 * Unless the process's libcuda.so.1 is pilot's (libpilot-cuda.so, preloaded by `pilot run` for a
 * program that links the driver API): a static runtime then reaches pilot's driver and stops,
 * cleanly, at the integrity check pilot cannot compute, so nothing of the program runs outside
 * pilot, and a driver API program that merely carries an unused static runtime (CMake's default
 * for the CUDA samples) runs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define MAX_SECTIONS 4096
#define MAX_TABLE (1u << 20) /* section-name and dynamic string tables read, at most */

static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
    return pread(fd, buf, len, (off_t)off) == (ssize_t)len ? 0 : -1;
}

/* 1: the executable at `path` registers device code and does not need libcudart; 0 otherwise or when
 * it cannot tell (never a false alarm). */
static int static_runtime(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int found = 0, needs_cudart = 0;
    Elf64_Ehdr eh;
    Elf64_Shdr *sh = NULL;
    char *names = NULL, *dynstr = NULL;
    Elf64_Dyn *dyn = NULL;
    if (read_at(fd, &eh, sizeof eh, 0) || memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        !eh.e_shnum || eh.e_shnum > MAX_SECTIONS || eh.e_shstrndx >= eh.e_shnum)
        goto out;
    sh = malloc((size_t)eh.e_shnum * sizeof *sh);
    if (!sh || read_at(fd, sh, (size_t)eh.e_shnum * sizeof *sh, eh.e_shoff))
        goto out;
    const Elf64_Shdr *strs = &sh[eh.e_shstrndx];
    if (!strs->sh_size || strs->sh_size > MAX_TABLE || !(names = malloc(strs->sh_size + 1)) ||
        read_at(fd, names, strs->sh_size, strs->sh_offset))
        goto out;
    names[strs->sh_size] = '\0';
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        if (sh[i].sh_name >= strs->sh_size)
            continue;
        const char *name = names + sh[i].sh_name;
        /* the fatbin wrappers a runtime registers; not `.nv_fatbin` alone, which nvcc leaves,
         * with nothing to register, in host code it compiles (a driver API program's) */
        if (!strcmp(name, ".nvFatBinSegment"))
            found = 1;
        if (sh[i].sh_type != SHT_DYNAMIC || dyn || sh[i].sh_link >= eh.e_shnum)
            continue;
        const Elf64_Shdr *ds = &sh[sh[i].sh_link];
        if (!sh[i].sh_size || sh[i].sh_size > MAX_TABLE || !ds->sh_size || ds->sh_size > MAX_TABLE)
            continue;
        dyn = malloc(sh[i].sh_size);
        dynstr = malloc(ds->sh_size + 1);
        if (!dyn || !dynstr || read_at(fd, dyn, sh[i].sh_size, sh[i].sh_offset) ||
            read_at(fd, dynstr, ds->sh_size, ds->sh_offset))
            goto out;
        dynstr[ds->sh_size] = '\0';
        for (size_t k = 0; k < sh[i].sh_size / sizeof *dyn && dyn[k].d_tag != DT_NULL; k++)
            if (dyn[k].d_tag == DT_NEEDED && dyn[k].d_un.d_val < ds->sh_size &&
                !strncmp(dynstr + dyn[k].d_un.d_val, "libcudart.so", 12))
                needs_cudart = 1;
    }
out:
    free(sh);
    free(names);
    free(dyn);
    free(dynstr);
    close(fd);
    return found && !needs_cudart;
}

/* Whether the libcuda.so.1 loaded in the process is pilot's driver library. */
static int driver_is_pilots(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *init = dlsym(h, "cuInit");
    Dl_info info;
    int ours = init && dladdr(init, &info) && info.dli_fname &&
               strstr(info.dli_fname, "libpilot-cuda") != NULL;
    dlclose(h);
    return ours;
}

#define STATIC_MESSAGE                                                                         \
    "this program links the CUDA runtime statically (nvcc's default), which pilot cannot "      \
    "carry: its GPU work would run outside pilot, unshared and unaccounted. Rebuild it with "   \
    "`nvcc -cudart shared`"

__attribute__((constructor)) static void refuse_static_runtime(void)
{
    if (!static_runtime("/proc/self/exe"))
        return;
    if (driver_is_pilots()) {
        LOG_INFO("this program links the CUDA runtime statically; its libcuda is pilot's, so its "
                 "driver API calls run under pilot and its runtime calls fail (rebuild it with "
                 "`nvcc -cudart shared` to run them too)");
        return;
    }
    const char *mode = getenv("PILOT_STATIC_RUNTIME");
    if (mode && strcmp(mode, "warn") == 0) {
        LOG_WARN(STATIC_MESSAGE "; it runs outside pilot (PILOT_STATIC_RUNTIME=warn).");
        return;
    }
    LOG_ERROR(STATIC_MESSAGE ". Refused (exit status 3); PILOT_STATIC_RUNTIME=warn runs it "
              "anyway, outside pilot.");
    _exit(3);
}
