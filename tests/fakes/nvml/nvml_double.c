/*
 * nvml_double.c - an NVML test double built as libnvidia-ml.so.1.
 *
 * The real, unmodified pynvml (nvidia-ml-py) loads this library and drives it.
 * A JSON fixture describes one node (GPUs, links, errors, MIG profile table);
 * a JSON state file holds everything that changes (MIG mode, GPU/compute
 * instances, running processes) so that separate processes see the same node.
 * See README.md next to this file for the schema, env vars and error mapping.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999,
};

#define MIB (1024ULL * 1024ULL)
#define MAXG 16          /* GPUs per fixture */
#define MAXGI 15         /* GPU instance ids 0..14 (buddy tree) */
#define MAXCI 8          /* compute instance ids 0..7 */
#define MAXPROC 64
#define MAXFAULT 64
#define MAXCPUWORDS 16   /* 1024 CPUs */
#define NA_ID 0xFFFFFFFFu

/* ------------------------------------------------------------------ */
/* Public struct layouts (nvml.h)                                      */

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 (unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24))

typedef struct { unsigned int start, size; } nvmlPlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
    unsigned int capabilities;
} nvmlComputeInstanceProfileInfo_v3_t;

#define GIP_V2 (unsigned)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24))
#define GIP_V3 (unsigned)(sizeof(nvmlGpuInstanceProfileInfo_v3_t) | (3u << 24))
#define CIP_V2 (unsigned)(sizeof(nvmlComputeInstanceProfileInfo_v2_t) | (2u << 24))
#define CIP_V3 (unsigned)(sizeof(nvmlComputeInstanceProfileInfo_v3_t) | (3u << 24))

typedef struct { void *device; unsigned int id, profileId; nvmlPlacement_t placement; } nvmlGpuInstanceInfo_t;
typedef struct { void *device; void *gpuInstance; unsigned int id, profileId; nvmlPlacement_t placement; } nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "pci info");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "mem v2");
_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_v2_t) == 0x98, "gip v2");
_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_v3_t) == 0x98, "gip v3");
_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_v2_t) == 0x88, "cip v2");
_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_v3_t) == 0x8C, "cip v3");
_Static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24, "gi info");
_Static_assert(sizeof(nvmlComputeInstanceInfo_t) == 32, "ci info");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "proc info");

/* ------------------------------------------------------------------ */
/* MIG profile tables (mig.md)                                         */

typedef struct {
    int enumv, id;
    const char *name;
    int cslices, msize, maxinst, nstarts;
    int starts[7];
    int sm, ce, dec, enc, jpeg, ofa;
    unsigned long long mem_mb;
} gip_t;

typedef struct { const char *name; int n; gip_t p[7]; } miptable_t;

static const miptable_t MIG_TABLES[] = {
    { "A100-80GB", 7, {
        { 0, 19, "1g.10gb",    1, 1, 7, 7, {0,1,2,3,4,5,6}, 14, 1, 0, 0, 0, 0, 9728 },
        { 1, 14, "2g.20gb",    2, 2, 3, 3, {0,2,4},         28, 2, 1, 0, 0, 0, 19968 },
        { 2,  9, "3g.40gb",    3, 4, 2, 2, {0,4},           42, 3, 2, 0, 0, 0, 40192 },
        { 3,  5, "4g.40gb",    4, 4, 1, 1, {0},             56, 4, 2, 0, 0, 0, 40192 },
        { 4,  0, "7g.80gb",    7, 8, 1, 1, {0},             98, 7, 5, 0, 1, 1, 80896 },
        { 7, 20, "1g.10gb+me", 1, 1, 1, 7, {0,1,2,3,4,5,6}, 14, 1, 1, 0, 1, 1, 9728 },
        { 9, 15, "1g.20gb",    1, 2, 4, 4, {0,2,4,6},       14, 1, 1, 0, 0, 0, 19968 },
    } },
    /* Read from a real H200 (NVML 13.580.159.04, MIG disabled) by tools/gpu_reality_check.py, 2026-12-04. */
    { "H200-141GB", 7, {
        { 0, 19, "1g.18gb",    1, 1, 7, 7, {0,1,2,3,4,5,6},  16, 1, 1, 0, 1, 0, 16384 },
        { 1, 14, "2g.35gb",    2, 2, 3, 3, {0,2,4},          32, 2, 2, 0, 2, 0, 33280 },
        { 2,  9, "3g.71gb",    3, 4, 2, 2, {0,4},            60, 3, 3, 0, 3, 0, 71424 },
        { 3,  5, "4g.71gb",    4, 4, 1, 1, {0},              64, 4, 4, 0, 4, 0, 71424 },
        { 4,  0, "7g.141gb",   7, 8, 1, 1, {0},             132, 8, 7, 0, 7, 1, 143360 },
        { 7, 20, "1g.18gb+me", 1, 1, 1, 7, {0,1,2,3,4,5,6},  16, 1, 1, 0, 1, 1, 16384 },
        { 9, 15, "1g.35gb",    1, 2, 4, 4, {0,2,4,6},        26, 1, 1, 0, 1, 0, 33280 },
    } },
    { "H100-80GB", 7, {
        { 0, 19, "1g.10gb",    1, 1, 7, 7, {0,1,2,3,4,5,6},  16, 1, 1, 0, 1, 0, 9984 },
        { 1, 14, "2g.20gb",    2, 2, 3, 3, {0,2,4},          32, 2, 2, 0, 2, 0, 20096 },
        { 2,  9, "3g.40gb",    3, 4, 2, 2, {0,4},            60, 3, 3, 0, 3, 0, 40448 },
        { 3,  5, "4g.40gb",    4, 4, 1, 1, {0},              64, 4, 4, 0, 4, 0, 40448 },
        { 4,  0, "7g.80gb",    7, 8, 1, 1, {0},             132, 8, 7, 0, 7, 1, 81152 },
        { 7, 20, "1g.10gb+me", 1, 1, 1, 7, {0,1,2,3,4,5,6},  16, 1, 1, 0, 1, 1, 9984 },
        { 9, 15, "1g.20gb",    1, 2, 4, 4, {0,2,4,6},        26, 1, 1, 0, 1, 0, 20096 },
    } },
};
#define NTABLES (int)(sizeof(MIG_TABLES) / sizeof(MIG_TABLES[0]))

/* Compute-instance profile id == CI enum; compute slices per id. */
static const int CI_SLICES[] = { 1, 2, 3, 4, 7 };
#define NCIPROF 5

static const gip_t *gip_by_id(const miptable_t *t, int id)
{
    for (int i = 0; t && i < t->n; i++)
        if (t->p[i].id == id) return &t->p[i];
    return NULL;
}

static const gip_t *gip_by_enum(const miptable_t *t, int e)
{
    for (int i = 0; t && i < t->n; i++)
        if (t->p[i].enumv == e) return &t->p[i];
    return NULL;
}

/* Buddy-tree GPU-instance id over 8 memory slices (mig.md section 4):
 * 0 whole, halves 4:4 -> 1 and 0:4 -> 2 (observed), quarters 3 + start/2,
 * eighths 7 + start. */
static int gi_buddy_id(int start, int size)
{
    switch (size) {
    case 8: return 0;
    case 4: return start == 0 ? 2 : 1;
    case 2: return 3 + start / 2;
    default: return 7 + start;
    }
}

/* Which CI profiles a GI with `s` compute slices offers. */
static int ci_allowed(int s, int c)
{
    if (c > s) return 0;
    if (c == s) return 1;
    if (c == 1 || c == 2) return 1;
    return s == 7; /* 3c and 4c only inside a 7-slice GI */
}

/* CI placements (compute slices) of a `c`-slice CI inside an `s`-slice GI. */
static int ci_placements(int s, int c, int *starts)
{
    int n = 0;
    if (!ci_allowed(s, c)) return 0;
    if (c == s) { starts[n++] = 0; return n; }
    if (c == 1) { for (int i = 0; i < s; i++) starts[n++] = i; return n; }
    if (c == 2) { for (int i = 0; i + 2 <= s; i += 2) starts[n++] = i; return n; }
    if (c == 3) { starts[n++] = 0; starts[n++] = 4; return n; }
    starts[n++] = 0; /* 4c in 7g */
    return n;
}

/* ------------------------------------------------------------------ */
/* Model                                                               */

typedef struct { int id, profile_id, start, size; } ci_t;
typedef struct { int id, profile_id, start, size, nci; ci_t ci[MAXCI]; } gi_t;
typedef struct { unsigned pid; unsigned long long mem_mib; int gi, ci; } proc_t;
typedef struct {
    int mig_cur, mig_pend;
    int ngi; gi_t gi[MAXGI];
    int nproc; proc_t proc[MAXPROC];
} gstate_t;

typedef struct {
    char name[96], uuid[96], bus_id[32];
    unsigned domain, bus, dev, func, pci_dev_id, pci_sub_id;
    int minor, numa, memory_numa, pcie_switch;
    unsigned long long cpus[MAXCPUWORDS];
    unsigned long long mem_total, mem_used, mem_reserved; /* MiB */
    int has_pcie, gen_cur, gen_max, width_cur, width_max;
    int nvlinks; unsigned long long nvlink_down;        /* nvlinks < 0: no NVLink */
    int has_ecc; unsigned long long ecc[2][2];          /* [corr/uncorr][volatile/aggregate] */
    int has_rr; unsigned rr_corr, rr_unc, rr_pending, rr_failure;
    int lost;                                           /* 0, 1 = at handle lookup, 2 = after handle */
    int persistence, temperature, power_mw;
    int cc_major, cc_minor;                             /* CUDA compute capability; 0.0 = unknown */
    unsigned long long event_types;                     /* nvmlDeviceGetSupportedEventTypes */
    int nremote; char nvlink_remote[36][32];            /* NvLink remote PCI bus ids ("" = NVSwitch) */
    const miptable_t *mig;                              /* NULL: not MIG capable */
    gstate_t init;                                      /* initial mutable state */
} gpu_t;

typedef struct { char symbol[96]; int error; int gpu; } fault_t;

typedef struct {
    char driver_version[80], nvml_version[80];
    int cuda_version;
    int missing_node_error;
    int ngpus; gpu_t gpus[MAXG];
    int nfaults; fault_t faults[MAXFAULT];
} fixture_t;

typedef struct handle { int kind; int gpu; int gi; int ci; } handle_t;
enum { K_GPU = 1, K_MIG, K_GI, K_CI };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static fixture_t g_fx;
static gstate_t g_st[MAXG];
#define CFGPATH (PATH_MAX - 256)
static char g_fixture_path[CFGPATH], g_state_path[CFGPATH], g_dev_dir[CFGPATH];

static handle_t H_GPU[MAXG];
static handle_t H_MIG[MAXG][MAXGI][MAXCI];
static handle_t H_GI[MAXG][MAXGI];
static handle_t H_CI[MAXG][MAXGI][MAXCI];

static handle_t *mk(handle_t *h, int kind, int gpu, int gi, int ci)
{
    h->kind = kind; h->gpu = gpu; h->gi = gi; h->ci = ci;
    return h;
}

#define IN_ARRAY(p, arr) ((const char *)(p) >= (const char *)(arr) && \
                          (const char *)(p) < (const char *)(arr) + sizeof(arr))

static handle_t *as_kind(void *p, int kind)
{
    handle_t *h = p;
    if (!p) return NULL;
    int ok = (kind == K_GPU && IN_ARRAY(p, H_GPU)) || (kind == K_MIG && IN_ARRAY(p, H_MIG)) ||
             (kind == K_GI && IN_ARRAY(p, H_GI)) || (kind == K_CI && IN_ARRAY(p, H_CI));
    if (!ok || h->kind != kind || h->gpu < 0 || h->gpu >= g_fx.ngpus) return NULL;
    return h;
}

static handle_t *as_dev(void *p)
{
    handle_t *h = as_kind(p, K_GPU);
    return h ? h : as_kind(p, K_MIG);
}

/* ------------------------------------------------------------------ */
/* Fixture loading                                                     */

static char *slurp(const char *path, int *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) { *err = errno; return NULL; }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (n < cap - 1) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) { free(buf); buf = NULL; }
        else buf = nb;
    }
    fclose(f);
    if (!buf) { *err = ENOMEM; return NULL; }
    buf[n] = '\0';
    return buf;
}

static int parse_busid(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    unsigned a, b, c, d;
    if (sscanf(s, "%x:%x:%x.%x", &a, &b, &c, &d) == 4) {
        *dom = a; *bus = b; *dev = c; *fn = d;
        return 0;
    }
    if (sscanf(s, "%x:%x.%x", &b, &c, &d) == 3) {
        *dom = 0; *bus = b; *dev = c; *fn = d;
        return 0;
    }
    return -1;
}

static int parse_cpulist(const char *s, unsigned long long *mask)
{
    memset(mask, 0, sizeof(unsigned long long) * MAXCPUWORDS);
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b;
        if (end == s || a < 0) return -1;
        b = a;
        if (*end == '-') {
            s = end + 1;
            b = strtol(s, &end, 10);
            if (end == s || b < a) return -1;
        }
        if (b >= MAXCPUWORDS * 64) return -1;
        for (long i = a; i <= b; i++) mask[i / 64] |= 1ULL << (i % 64);
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return 0;
}

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

/* Parse a GI description (fixture or state) into gi_t. */
static int parse_gi(const jval *j, const miptable_t *t, gi_t *gi, char *err, size_t errlen)
{
    memset(gi, 0, sizeof(*gi));
    const gip_t *p = NULL;
    const char *pname = jstr(jget(j, "profile"), NULL);
    if (pname) {
        for (int i = 0; t && i < t->n; i++)
            if (!strcmp(t->p[i].name, pname)) p = &t->p[i];
    } else {
        p = gip_by_id(t, (int)jint(jget(j, "profile_id"), -1));
    }
    if (!p) { snprintf(err, errlen, "unknown GPU instance profile"); return -1; }
    gi->profile_id = p->id;
    gi->start = (int)jint(jget(j, "start"), p->starts[0]);
    gi->size = p->msize;
    gi->id = (int)jint(jget(j, "id"), gi_buddy_id(gi->start, gi->size));
    if (gi->id < 0 || gi->id >= MAXGI) { snprintf(err, errlen, "GPU instance id out of range"); return -1; }
    const jval *cis = jget(j, "compute_instances");
    if (!cis) {
        gi->nci = 1;
        gi->ci[0] = (ci_t){ 0, p->cslices == 7 ? 4 : p->cslices - 1, 0, p->cslices };
        return 0;
    }
    for (int k = 0; k < jlen(cis) && k < MAXCI; k++) {
        const jval *c = jat(cis, k);
        int pid = (int)jint(jget(c, "profile_id"), -1);
        if (pid < 0 || pid >= NCIPROF || !ci_allowed(p->cslices, CI_SLICES[pid])) {
            snprintf(err, errlen, "bad compute instance profile_id %d", pid);
            return -1;
        }
        ci_t *ci = &gi->ci[gi->nci++];
        ci->profile_id = pid;
        ci->size = CI_SLICES[pid];
        ci->start = (int)jint(jget(c, "start"), 0);
        ci->id = (int)jint(jget(c, "id"), k);
        if (ci->id < 0 || ci->id >= MAXCI) { snprintf(err, errlen, "compute instance id out of range"); return -1; }
    }
    return 0;
}

static int parse_procs(const jval *arr, gstate_t *st)
{
    st->nproc = 0;
    for (int k = 0; k < jlen(arr) && k < MAXPROC; k++) {
        const jval *p = jat(arr, k);
        proc_t *pr = &st->proc[st->nproc++];
        pr->pid = (unsigned)jint(jget(p, "pid"), 0);
        pr->mem_mib = (unsigned long long)jint(jget(p, "used_memory_mib"), 0);
        pr->gi = (int)jint(jget(p, "gpu_instance_id"), -1);
        pr->ci = (int)jint(jget(p, "compute_instance_id"), -1);
    }
    return 0;
}

/* Event types (nvml.h nvmlEventType*). */
#define EVT_SBE 0x1ULL
#define EVT_DBE 0x2ULL
#define EVT_PSTATE 0x4ULL
#define EVT_XID 0x8ULL
#define EVT_CLOCK 0x10ULL
#define EVT_ECC (EVT_SBE | EVT_DBE)
#define EVT_DEFAULT (EVT_PSTATE | EVT_XID | EVT_CLOCK)

/* CUDA compute capability from the fixture ("9.0"), else from the product name. */
static int parse_cc(const char *cc, gpu_t *g)
{
    static const struct { const char *needle; int major, minor; } BY_NAME[] = {
        { "GB200", 10, 0 }, { "B200", 10, 0 }, { "GH200", 9, 0 }, { "H200", 9, 0 }, { "H100", 9, 0 },
        { "H800", 9, 0 }, { "L40", 8, 9 }, { "L4", 8, 9 }, { "A100", 8, 0 }, { "A800", 8, 0 },
        { "A30", 8, 0 }, { "A40", 8, 6 }, { "A10", 8, 6 }, { "T4", 7, 5 }, { "V100", 7, 0 },
    };
    if (cc) {
        char tail;
        return sscanf(cc, "%d.%d%c", &g->cc_major, &g->cc_minor, &tail) == 2 ? 0 : -1;
    }
    for (size_t i = 0; i < sizeof BY_NAME / sizeof BY_NAME[0]; i++)
        if (strstr(g->name, BY_NAME[i].needle)) {
            g->cc_major = BY_NAME[i].major;
            g->cc_minor = BY_NAME[i].minor;
            return 0;
        }
    return 0;
}

static int load_gpu(const jval *j, int idx, gpu_t *g, char *err, size_t errlen)
{
    memset(g, 0, sizeof(*g));
    const char *name = jstr(jget(j, "name"), NULL), *uuid = jstr(jget(j, "uuid"), NULL);
    const char *bus = jstr(jget(j, "pci_bus_id"), NULL);
    if (!name || !uuid || !bus) { snprintf(err, errlen, "gpus[%d]: name, uuid and pci_bus_id are required", idx); return -1; }
    copy_str(g->name, sizeof g->name, name);
    copy_str(g->uuid, sizeof g->uuid, uuid);
    if (parse_busid(bus, &g->domain, &g->bus, &g->dev, &g->func)) {
        snprintf(err, errlen, "gpus[%d]: bad pci_bus_id '%s'", idx, bus);
        return -1;
    }
    snprintf(g->bus_id, sizeof g->bus_id, "%08X:%02X:%02X.%X", g->domain, g->bus, g->dev, g->func);
    g->pci_dev_id = (unsigned)jint(jget(j, "pci_device_id"), 0);
    g->pci_sub_id = (unsigned)jint(jget(j, "pci_subsystem_id"), 0);
    g->minor = (int)jint(jget(j, "minor"), idx);
    g->numa = (int)jint(jget(j, "numa_node"), -1);
    g->memory_numa = (int)jint(jget(j, "gpu_memory_numa_node"), -1);
    g->pcie_switch = (int)jint(jget(j, "pcie_switch"), -1);
    const char *aff = jstr(jget(j, "cpu_affinity"), NULL);
    if (aff && parse_cpulist(aff, g->cpus)) { snprintf(err, errlen, "gpus[%d]: bad cpu_affinity", idx); return -1; }
    const jval *m = jget(j, "memory");
    g->mem_total = (unsigned long long)jint(jget(m, "total_mib"), 0);
    g->mem_used = (unsigned long long)jint(jget(m, "used_mib"), 0);
    g->mem_reserved = (unsigned long long)jint(jget(m, "reserved_mib"), 0);
    const jval *pc = jget(j, "pcie");
    g->has_pcie = pc != NULL;
    g->gen_cur = (int)jint(jget(pc, "gen_current"), 0);
    g->gen_max = (int)jint(jget(pc, "gen_max"), g->gen_cur);
    g->width_cur = (int)jint(jget(pc, "width_current"), 0);
    g->width_max = (int)jint(jget(pc, "width_max"), g->width_cur);
    const jval *nv = jget(j, "nvlink");
    g->nvlinks = nv ? (int)jint(jget(nv, "links"), 0) : -1;
    if (g->nvlinks > 36) { snprintf(err, errlen, "gpus[%d]: too many nvlinks", idx); return -1; }
    const jval *down = jget(nv, "down");
    for (int k = 0; k < jlen(down); k++) {
        long long l = jint(jat(down, k), -1);
        if (l >= 0 && l < 64) g->nvlink_down |= 1ULL << l;
    }
    const jval *ecc = jget(j, "ecc");
    g->has_ecc = ecc != NULL;
    const char *ckeys[2] = { "volatile", "aggregate" }, *tkeys[2] = { "corrected", "uncorrected" };
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < 2; t++)
            g->ecc[t][c] = (unsigned long long)jint(jget(jget(ecc, ckeys[c]), tkeys[t]), 0);
    const jval *rr = jget(j, "remapped_rows");
    g->has_rr = rr != NULL;
    g->rr_corr = (unsigned)jint(jget(rr, "correctable"), 0);
    g->rr_unc = (unsigned)jint(jget(rr, "uncorrectable"), 0);
    g->rr_pending = (unsigned)jbool(jget(rr, "pending"), 0);
    g->rr_failure = (unsigned)jbool(jget(rr, "failure"), 0);
    const jval *lost = jget(j, "lost");
    if (lost && lost->t == J_STR) g->lost = !strcmp(lost->s, "after_handle") ? 2 : 1;
    else g->lost = jbool(lost, 0);
    g->persistence = jbool(jget(j, "persistence_mode"), 1);
    g->temperature = (int)jint(jget(j, "temperature_c"), 35);
    g->power_mw = (int)jint(jget(j, "power_mw"), 60000);
    if (parse_cc(jstr(jget(j, "cuda_compute_capability"), NULL), g)) {
        snprintf(err, errlen, "gpus[%d]: cuda_compute_capability must be \"MAJOR.MINOR\"", idx);
        return -1;
    }
    g->event_types = (unsigned long long)jint(jget(j, "event_types"),
                                              EVT_DEFAULT | (g->has_ecc ? EVT_ECC : 0));
    const jval *remote = jget(nv, "remote");
    for (int k = 0; k < jlen(remote) && k < 36; k++) {
        unsigned d, b, v, f;
        const char *r = jstr(jat(remote, k), "");
        if (*r && parse_busid(r, &d, &b, &v, &f)) {
            snprintf(err, errlen, "gpus[%d]: bad nvlink.remote[%d] '%s'", idx, k, r);
            return -1;
        }
        if (*r) snprintf(g->nvlink_remote[k], sizeof g->nvlink_remote[k], "%08X:%02X:%02X.%X", d, b, v, f);
        g->nremote = k + 1;
    }

    const jval *mig = jget(j, "mig");
    gstate_t *st = &g->init;
    if (mig) {
        const char *tn = jstr(jget(mig, "profile_table"), "");
        for (int t = 0; t < NTABLES; t++)
            if (!strcmp(MIG_TABLES[t].name, tn)) g->mig = &MIG_TABLES[t];
        if (!g->mig) { snprintf(err, errlen, "gpus[%d]: unknown mig.profile_table '%s'", idx, tn); return -1; }
        st->mig_cur = (int)jint(jget(mig, "mode"), 0);
        st->mig_pend = (int)jint(jget(mig, "pending_mode"), st->mig_cur);
        const jval *gis = jget(mig, "gpu_instances");
        for (int k = 0; k < jlen(gis) && k < MAXGI; k++) {
            char e2[128];
            if (parse_gi(jat(gis, k), g->mig, &st->gi[st->ngi++], e2, sizeof e2)) {
                snprintf(err, errlen, "gpus[%d].mig.gpu_instances[%d]: %s", idx, k, e2);
                return -1;
            }
        }
    }
    parse_procs(jget(j, "processes"), st);
    return 0;
}

static int load_fixture(char *err, size_t errlen, int *notfound)
{
    int e = 0;
    *notfound = 0;
    char *text = slurp(g_fixture_path, &e);
    if (!text) { *notfound = 1; return -1; }
    jval *root = json_parse(text, err, errlen);
    free(text);
    if (!root) return -1;
    fixture_t *fx = calloc(1, sizeof(*fx));
    int rc = -1;
    if (!fx) { snprintf(err, errlen, "out of memory"); goto done; }
    if (root->t != J_OBJ || !jget(root, "gpus") || jget(root, "gpus")->t != J_ARR) {
        snprintf(err, errlen, "top level must be an object with a 'gpus' array");
        goto done;
    }
    copy_str(fx->driver_version, sizeof fx->driver_version, jstr(jget(root, "driver_version"), "550.54.15"));
    copy_str(fx->nvml_version, sizeof fx->nvml_version, jstr(jget(root, "nvml_version"), "12.550.54.15"));
    fx->cuda_version = (int)jint(jget(root, "cuda_driver_version"), 12040);
    /* 0: a GPU without its device node is not enumerated (the default); else that code at handle lookup. */
    fx->missing_node_error = (int)jint(jget(root, "missing_node_error"), 0);
    const jval *gpus = jget(root, "gpus");
    if (jlen(gpus) > MAXG) { snprintf(err, errlen, "at most %d gpus", MAXG); goto done; }
    for (int i = 0; i < jlen(gpus); i++) {
        if (load_gpu(jat(gpus, i), i, &fx->gpus[i], err, errlen)) goto done;
        fx->ngpus++;
    }
    const jval *faults = jget(root, "faults");
    for (int i = 0; i < jlen(faults) && i < MAXFAULT; i++) {
        const jval *f = jat(faults, i);
        const char *sym = jstr(jget(f, "symbol"), NULL);
        if (!sym) { snprintf(err, errlen, "faults[%d]: symbol required", i); goto done; }
        fault_t *ft = &fx->faults[fx->nfaults++];
        copy_str(ft->symbol, sizeof ft->symbol, sym);
        ft->error = (int)jint(jget(f, "error"), NVML_ERROR_UNKNOWN);
        ft->gpu = (int)jint(jget(f, "gpu"), -1);
    }
    g_fx = *fx;
    rc = 0;
done:
    free(fx);
    json_free(root);
    return rc;
}

static int fault(const char *sym, int gpu)
{
    for (int i = 0; i < g_fx.nfaults; i++) {
        const fault_t *f = &g_fx.faults[i];
        if (!strcmp(f->symbol, sym) && (f->gpu < 0 || f->gpu == gpu)) return f->error;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* State file                                                          */

static void lock_path(char *out, size_t n)
{
    snprintf(out, n, "%s.lock", g_state_path);
}

static void mkdirs_for(const char *path)
{
    char tmp[PATH_MAX];
    copy_str(tmp, sizeof tmp, path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(tmp, 0755);
        *p = '/';
    }
}

/* Returns an fd holding the lock, or -1 (reads then go unlocked). */
static int state_lock(int exclusive)
{
    char lp[PATH_MAX];
    lock_path(lp, sizeof lp);
    int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && exclusive && errno == ENOENT) {
        mkdirs_for(lp);
        fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    }
    if (fd < 0) fd = open(lp, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    while (flock(fd, exclusive ? LOCK_EX : LOCK_SH) < 0) {
        if (errno != EINTR) { close(fd); return -1; }
    }
    return fd;
}

static void state_unlock(int fd)
{
    if (fd >= 0) { flock(fd, LOCK_UN); close(fd); }
}

/* Fill g_st from the state file (GPUs keyed by UUID) or the fixture. */
static void state_read(int *exists)
{
    for (int i = 0; i < g_fx.ngpus; i++) g_st[i] = g_fx.gpus[i].init;
    *exists = 0;
    int e = 0;
    char *text = slurp(g_state_path, &e);
    if (!text) return;
    *exists = 1;
    char err[128];
    jval *root = json_parse(text, err, sizeof err);
    free(text);
    if (!root) {
        fprintf(stderr, "nvml-double: ignoring malformed state file %s: %s\n", g_state_path, err);
        *exists = 0;
        return;
    }
    const jval *gpus = jget(root, "gpus");
    for (int i = 0; i < g_fx.ngpus; i++) {
        const jval *gj = jget(gpus, g_fx.gpus[i].uuid);
        if (!gj) continue;
        gstate_t st;
        memset(&st, 0, sizeof st);
        st.mig_cur = (int)jint(jget(gj, "mig_current"), 0);
        st.mig_pend = (int)jint(jget(gj, "mig_pending"), st.mig_cur);
        const jval *gis = jget(gj, "gpu_instances");
        int ok = 1;
        for (int k = 0; k < jlen(gis) && k < MAXGI && g_fx.gpus[i].mig; k++)
            if (parse_gi(jat(gis, k), g_fx.gpus[i].mig, &st.gi[st.ngi++], err, sizeof err)) ok = 0;
        parse_procs(jget(gj, "processes"), &st);
        if (ok) g_st[i] = st;
    }
    json_free(root);
}

/* The driver's MIG capability tree, /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>[/ci<id>]/access: the kernel
 * module adds an entry when a GPU or compute instance is created and removes it when the instance is destroyed
 * (open-gpu-kernel-modules nv-caps).  Kept in step with the state, but only where the node's view already holds that
 * tree (its mig/config entry, written by the lab's node root): minors as /proc/driver/nvidia-caps/mig-minors numbers
 * them (lab noderoot.py mig_gi_minor: 15 GPU instances of 8 compute instances per GPU, after config 1 and monitor 2). */
#define CAP_GIS 15
#define CAP_CIS 8
#define CAP_ACCESS_MODE 0444

static void env_path(char *out, size_t n, const char *var, const char *def);

static void caps_remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[PATH_MAX];
            if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) continue;
            struct stat sb;
            if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode)) caps_remove_tree(sub);
            else unlink(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

static void caps_write_access(const char *dir, int minor)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/access", dir) >= (int)sizeof path) return;
    mkdirs_for(path);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, CAP_ACCESS_MODE);
    fclose(f);
}

static void caps_sync(void)
{
    char caps[CFGPATH], marker[PATH_MAX];
    env_path(caps, sizeof caps, "NVML_DOUBLE_CAPS_DIR", "/proc/driver/nvidia/capabilities");
    if (snprintf(marker, sizeof marker, "%s/mig/config", caps) >= (int)sizeof marker || access(marker, F_OK) != 0) return;
    for (int i = 0; i < g_fx.ngpus; i++) {
        if (!g_fx.gpus[i].mig) continue;
        int minor = g_fx.gpus[i].minor;
        char mig[PATH_MAX];
        if (snprintf(mig, sizeof mig, "%s/gpu%d/mig", caps, minor) >= (int)sizeof mig) continue;
        DIR *d = opendir(mig);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                if (strncmp(e->d_name, "gi", 2) != 0) continue;
                char sub[PATH_MAX];
                if (snprintf(sub, sizeof sub, "%s/%s", mig, e->d_name) < (int)sizeof sub) caps_remove_tree(sub);
            }
            closedir(d);
        }
        const gstate_t *s = &g_st[i];
        for (int k = 0; k < s->ngi; k++) {
            const gi_t *gi = &s->gi[k];
            int base = 3 + CAP_GIS * (CAP_CIS + 1) * minor + (CAP_CIS + 1) * gi->id;
            char gdir[PATH_MAX];
            if (snprintf(gdir, sizeof gdir, "%s/gi%d", mig, gi->id) >= (int)sizeof gdir) continue;
            caps_write_access(gdir, base);
            for (int c = 0; c < gi->nci; c++) {
                char cdir[PATH_MAX];
                if (snprintf(cdir, sizeof cdir, "%s/ci%d", gdir, gi->ci[c].id) < (int)sizeof cdir)
                    caps_write_access(cdir, base + 1 + gi->ci[c].id);
            }
        }
    }
}

/* Write g_st atomically (temp file + rename), then the driver's capability tree. Returns an NVML code. */
static int state_write(void)
{
    char dir[CFGPATH], tmp[PATH_MAX];
    copy_str(dir, sizeof dir, g_state_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else copy_str(dir, sizeof dir, ".");
    mkdirs_for(g_state_path);
    snprintf(tmp, sizeof tmp, "%s/.nvml-double-state.XXXXXX", dir);
    int fd = mkstemp(tmp);
    if (fd < 0) return (errno == EACCES || errno == EPERM || errno == EROFS) ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    fchmod(fd, 0644);
    FILE *f = fdopen(fd, "w");
    if (!f) { close(fd); unlink(tmp); return NVML_ERROR_UNKNOWN; }
    fprintf(f, "{\n  \"format\": 1,\n  \"gpus\": {");
    for (int i = 0; i < g_fx.ngpus; i++) {
        const gstate_t *s = &g_st[i];
        fprintf(f, "%s\n    \"%s\": {\"mig_current\": %d, \"mig_pending\": %d, \"gpu_instances\": [",
                i ? "," : "", g_fx.gpus[i].uuid, s->mig_cur, s->mig_pend);
        for (int k = 0; k < s->ngi; k++) {
            const gi_t *gi = &s->gi[k];
            fprintf(f, "%s{\"id\": %d, \"profile_id\": %d, \"start\": %d, \"size\": %d, \"compute_instances\": [",
                    k ? ", " : "", gi->id, gi->profile_id, gi->start, gi->size);
            for (int c = 0; c < gi->nci; c++)
                fprintf(f, "%s{\"id\": %d, \"profile_id\": %d, \"start\": %d, \"size\": %d}", c ? ", " : "",
                        gi->ci[c].id, gi->ci[c].profile_id, gi->ci[c].start, gi->ci[c].size);
            fprintf(f, "]}");
        }
        fprintf(f, "], \"processes\": [");
        for (int k = 0; k < s->nproc; k++)
            fprintf(f, "%s{\"pid\": %u, \"used_memory_mib\": %llu, \"gpu_instance_id\": %d, \"compute_instance_id\": %d}",
                    k ? ", " : "", s->proc[k].pid, s->proc[k].mem_mib, s->proc[k].gi, s->proc[k].ci);
        fprintf(f, "]}");
    }
    fprintf(f, "\n  }\n}\n");
    int bad = fflush(f) != 0 || fsync(fd) != 0;
    if (fclose(f) != 0) bad = 1;
    if (bad || rename(tmp, g_state_path) != 0) {
        int e = errno;
        unlink(tmp);
        return (e == EACCES || e == EPERM) ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    }
    caps_sync();
    return NVML_SUCCESS;
}

/* Read-only snapshot of the state into g_st. */
static void state_snapshot(void)
{
    int exists, fd = state_lock(0);
    state_read(&exists);
    state_unlock(fd);
}

/* ------------------------------------------------------------------ */
/* Helpers                                                             */

static void env_path(char *out, size_t n, const char *var, const char *def)
{
    const char *v = getenv(var);
    copy_str(out, n, (v && *v) ? v : def);
}

/* Open a device node like the real library; map errno to an NVML code. */
static int open_node_flags(const char *name, int missing_rc, int flags)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", g_dev_dir, name);
    int fd = open(path, flags | O_CLOEXEC);
    if (fd >= 0) { close(fd); return NVML_SUCCESS; }
    switch (errno) {
    case ENXIO: case ENODEV: return NVML_SUCCESS; /* node exists, no driver behind it */
    case EACCES: return NVML_ERROR_NO_PERMISSION;
    case ENOENT: return missing_rc;
    case EPERM: return NVML_ERROR_UNKNOWN;       /* devices-cgroup denial: "Unknown Error" in the field */
    default: return NVML_ERROR_UNKNOWN;
    }
}

static int open_node(const char *name, int missing_rc)
{
    return open_node_flags(name, missing_rc, O_RDWR);
}

static int gpu_node_check(int i)
{
    char name[32];
    snprintf(name, sizeof name, "nvidia%d", g_fx.gpus[i].minor);
    return open_node(name, g_fx.missing_node_error ? g_fx.missing_node_error : NVML_ERROR_NOT_FOUND);
}

/* Whether GPU i is enumerated.  The real library attaches only the GPUs whose device node it finds: a container
 * given /dev/nvidia1 alone sees one GPU, index 0 (NVIDIA/nvidia-docker#170: NVML "will report the right number of
 * GPUs by ignoring the ones" it cannot use; the CDI and nvidia-docker isolation rests on it).  With an explicit
 * missing_node_error a fixture keeps every GPU and fails the handle instead. */
static int gpu_enumerated(int i)
{
    char path[PATH_MAX];
    struct stat st;
    if (g_fx.missing_node_error) return 1;
    snprintf(path, sizeof path, "%s/nvidia%d", g_dev_dir, g_fx.gpus[i].minor);
    return !(stat(path, &st) != 0 && errno == ENOENT);
}

/* The fixture index of the index-th enumerated GPU, or -1. */
static int enumerated_gpu(unsigned index)
{
    for (int i = 0; i < g_fx.ngpus; i++)
        if (gpu_enumerated(i) && index-- == 0) return i;
    return -1;
}

static int enumerated_index(int gpu)
{
    int index = 0;
    for (int i = 0; i < gpu; i++) index += gpu_enumerated(i);
    return index;
}

static int mig_admin_allowed(void)
{
    if (geteuid() == 0) return 1;
    /* capability files are opened read-only (mig/config is 0400 by default) */
    return open_node_flags("nvidia-caps/nvidia-cap1", NVML_ERROR_NO_PERMISSION, O_RDONLY) == NVML_SUCCESS;
}

/* The memory of a MIG-enabled GPU is read through the mig/monitor capability: a process that cannot open
 * nvidia-caps/nvidia-cap2 (absent from its /dev, or denied by its devices cgroup) gets Insufficient Permissions, as
 * the device plugin does in a container without NVIDIA_MIG_MONITOR_DEVICES (k8s-device-plugin#399, "error getting
 * device memory info") or without device-cgroup access to the capability (nvidia-container-toolkit#1740).  On a
 * node the file is 0444 (the driver's DeviceFileMode 292), so every local process passes. */
static int mig_monitor_allowed(void)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/nvidia-caps/nvidia-cap2", g_dev_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) { close(fd); return 1; }
    return errno == ENXIO || errno == ENODEV; /* a mknod'd node with no driver behind it */
}

static gi_t *find_gi(gstate_t *s, int id)
{
    for (int k = 0; k < s->ngi; k++)
        if (s->gi[k].id == id) return &s->gi[k];
    return NULL;
}

static ci_t *find_ci(gi_t *gi, int id)
{
    for (int k = 0; gi && k < gi->nci; k++)
        if (gi->ci[k].id == id) return &gi->ci[k];
    return NULL;
}

static int put_str(char *dst, unsigned len, const char *src)
{
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* MIG devices of a GPU ordered by (GI id, CI id). */
static int mig_list(const gstate_t *s, int *gis, int *cis)
{
    int n = 0;
    for (int g = 0; g < MAXGI; g++)
        for (int k = 0; k < s->ngi; k++) {
            if (s->gi[k].id != g) continue;
            for (int c = 0; c < MAXCI; c++)
                for (int m = 0; m < s->gi[k].nci; m++)
                    if (s->gi[k].ci[m].id == c) { gis[n] = g; cis[n] = c; n++; }
        }
    return n;
}

static void mig_uuid(const gpu_t *g, int gi, int ci, char *out, size_t n)
{
    unsigned char b[16];
    unsigned long long h1 = 1469598103934665603ULL, h2 = 1099511628211ULL * 31;
    char seed[160];
    snprintf(seed, sizeof seed, "%s/%d/%d", g->uuid, gi, ci);
    for (const char *p = seed; *p; p++) {
        h1 = (h1 ^ (unsigned char)*p) * 1099511628211ULL;
        h2 = (h2 ^ (unsigned char)*p) * 0x100000001b3ULL + 0x9E3779B97F4A7C15ULL;
    }
    for (int i = 0; i < 8; i++) { b[i] = (unsigned char)(h1 >> (8 * i)); b[8 + i] = (unsigned char)(h2 >> (8 * i)); }
    snprintf(out, n, "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void ci_name(const gip_t *p, int cslices, char *out, size_t n)
{
    if (cslices == p->cslices) snprintf(out, n, "%s", p->name);
    else snprintf(out, n, "%dc.%s", cslices, p->name);
}

/* ------------------------------------------------------------------ */
/* Entry-point scaffolding                                             */

#define FAIL(x) do { rc = (x); goto out; } while (0)
#define BEGIN() int rc = NVML_SUCCESS; pthread_mutex_lock(&g_mu); \
    if (g_refcount <= 0) FAIL(NVML_ERROR_UNINITIALIZED)
#define END() out: pthread_mutex_unlock(&g_mu); return rc
#define FAULT(gpu) do { int _f = fault(__func__, (gpu)); if (_f) FAIL(_f); } while (0)
/* Device entry: h (handle), g (gpu), mig (is MIG handle). Lost GPUs fail. */
#define DEV_BEGIN(d) BEGIN(); handle_t *h = as_dev(d); if (!h) FAIL(NVML_ERROR_INVALID_ARGUMENT); \
    FAULT(h->gpu); gpu_t *g = &g_fx.gpus[h->gpu]; int mig = h->kind == K_MIG; (void)g; (void)mig; \
    if (g->lost) FAIL(NVML_ERROR_GPU_IS_LOST)
#define PHYS_ONLY() do { if (mig) FAIL(NVML_ERROR_NOT_SUPPORTED); } while (0)

/* Validate a MIG handle against the current state; sets gi/ci pointers. */
static int mig_resolve(handle_t *h, gi_t **gip, ci_t **cip)
{
    state_snapshot();
    gstate_t *s = &g_st[h->gpu];
    gi_t *gi = s->mig_cur ? find_gi(s, h->gi) : NULL;
    ci_t *ci = find_ci(gi, h->ci);
    if (!ci) return NVML_ERROR_INVALID_ARGUMENT;
    if (gip) *gip = gi;
    if (cip) *cip = ci;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Init / shutdown / system                                            */

static int do_init(const char *sym)
{
    int rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_mu);
    env_path(g_fixture_path, sizeof g_fixture_path, "NVML_DOUBLE_FIXTURE", "/etc/nvml-double/fixture.json");
    env_path(g_state_path, sizeof g_state_path, "NVML_DOUBLE_STATE", "/var/lib/nvml-double/state.json");
    env_path(g_dev_dir, sizeof g_dev_dir, "NVML_DOUBLE_DEV_DIR", "/dev");
    char err[256] = "";
    int notfound;
    if (load_fixture(err, sizeof err, &notfound)) {
        if (notfound) FAIL(NVML_ERROR_DRIVER_NOT_LOADED);
        fprintf(stderr, "nvml-double: malformed fixture %s: %s\n", g_fixture_path, err);
        FAIL(NVML_ERROR_UNKNOWN);
    }
    { int f = fault(sym, -1); if (f) FAIL(f); }
    rc = open_node("nvidiactl", NVML_ERROR_DRIVER_NOT_LOADED);
    if (rc) goto out;
    /* Materialise the state file from the fixture when absent (best effort). */
    if (access(g_state_path, F_OK) != 0) {
        int fd = state_lock(1), exists;
        if (fd >= 0) {
            state_read(&exists);
            if (!exists) state_write();
            state_unlock(fd);
        }
    }
    g_refcount++;
out:
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init("nvmlInitWithFlags"); }
API nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
API nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }

API nvmlReturn_t nvmlShutdown(void)
{
    BEGIN();
    FAULT(-1);
    g_refcount--;
    END();
}

API const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch";
    case NVML_ERROR_NOT_READY: return "Not ready";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    BEGIN();
    FAULT(-1);
    rc = put_str(version, length, g_fx.driver_version);
    END();
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    BEGIN();
    FAULT(-1);
    rc = put_str(version, length, g_fx.nvml_version);
    END();
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    BEGIN();
    FAULT(-1);
    if (!v) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *v = g_fx.cuda_version;
    END();
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    BEGIN();
    FAULT(-1);
    if (!v) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *v = g_fx.cuda_version;
    END();
}

/* ------------------------------------------------------------------ */
/* Device enumeration                                                  */

static int count_impl(const char *sym, unsigned int *count)
{
    BEGIN();
    { int f = fault(sym, -1); if (f) FAIL(f); }
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    for (int i = 0; i < g_fx.ngpus; i++) *count += (unsigned)gpu_enumerated(i);
    END();
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return count_impl("nvmlDeviceGetCount_v2", count); }
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return count_impl("nvmlDeviceGetCount", count); }

/* Hand out the handle of GPU i after the kernel permission check. */
static int gpu_handle(int i, void **device)
{
    int rc = gpu_node_check(i);
    if (rc) return rc;
    if (g_fx.gpus[i].lost == 1) return NVML_ERROR_GPU_IS_LOST;
    *device = mk(&H_GPU[i], K_GPU, i, -1, -1);
    return NVML_SUCCESS;
}

static int by_index_impl(const char *sym, unsigned int index, void **device)
{
    BEGIN();
    int gpu = enumerated_gpu(index);
    { int f = fault(sym, gpu < 0 ? (int)index : gpu); if (f) FAIL(f); }
    if (!device || gpu < 0) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    rc = gpu_handle(gpu, device);
    END();
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device)
{
    return by_index_impl("nvmlDeviceGetHandleByIndex_v2", index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **device)
{
    return by_index_impl("nvmlDeviceGetHandleByIndex", index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device)
{
    BEGIN();
    if (!uuid || !device) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g_fx.ngpus; i++) {
        if (!strcasecmp(uuid, g_fx.gpus[i].uuid)) {
            FAULT(i);
            rc = gpu_handle(i, device);
            goto out;
        }
    }
    if (!strncmp(uuid, "MIG-", 4)) {
        for (int i = 0; i < g_fx.ngpus; i++) {
            if (!g_fx.gpus[i].mig) continue;
            state_snapshot();
            int gis[64], cis[64], n = g_st[i].mig_cur ? mig_list(&g_st[i], gis, cis) : 0;
            for (int k = 0; k < n; k++) {
                char u[96];
                mig_uuid(&g_fx.gpus[i], gis[k], cis[k], u, sizeof u);
                if (strcasecmp(u, uuid)) continue;
                FAULT(i);
                void *parent;
                rc = gpu_handle(i, &parent);
                if (!rc) *device = mk(&H_MIG[i][gis[k]][cis[k]], K_MIG, i, gis[k], cis[k]);
                goto out;
            }
        }
    }
    FAULT(-1);
    rc = NVML_ERROR_NOT_FOUND;
    END();
}

static int by_bus_impl(const char *sym, const char *bus, void **device)
{
    BEGIN();
    unsigned d, b, v, f;
    if (!bus || !device || parse_busid(bus, &d, &b, &v, &f)) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g_fx.ngpus; i++) {
        const gpu_t *g = &g_fx.gpus[i];
        if (g->domain == d && g->bus == b && g->dev == v && g->func == f) {
            int fl = fault(sym, i);
            if (fl) FAIL(fl);
            rc = gpu_handle(i, device);
            goto out;
        }
    }
    { int fl = fault(sym, -1); if (fl) FAIL(fl); }
    rc = NVML_ERROR_NOT_FOUND;
    END();
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **device)
{
    return by_bus_impl("nvmlDeviceGetHandleByPciBusId_v2", bus, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, void **device)
{
    return by_bus_impl("nvmlDeviceGetHandleByPciBusId", bus, device);
}

/* ------------------------------------------------------------------ */
/* Device identity                                                     */

API nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length)
{
    DEV_BEGIN(device);
    if (mig) {
        gi_t *gi; ci_t *ci;
        if ((rc = mig_resolve(h, &gi, &ci))) goto out;
        const gip_t *p = gip_by_id(g->mig, gi->profile_id);
        char cn[64], full[160];
        ci_name(p, ci->size, cn, sizeof cn);
        snprintf(full, sizeof full, "%s MIG %s", g->name, cn);
        rc = put_str(name, length, full);
    } else {
        rc = put_str(name, length, g->name);
    }
    END();
}

API nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length)
{
    DEV_BEGIN(device);
    if (mig) {
        char u[96];
        if ((rc = mig_resolve(h, NULL, NULL))) goto out;
        mig_uuid(g, h->gi, h->ci, u, sizeof u);
        rc = put_str(uuid, length, u);
    } else {
        rc = put_str(uuid, length, g->uuid);
    }
    END();
}

API nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned int *index)
{
    BEGIN();
    handle_t *h = as_dev(device);
    if (!h || !index) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    FAULT(h->gpu);
    if (h->kind == K_MIG) {
        if ((rc = mig_resolve(h, NULL, NULL))) goto out;
        int gis[64], cis[64], n = mig_list(&g_st[h->gpu], gis, cis);
        for (int k = 0; k < n; k++)
            if (gis[k] == h->gi && cis[k] == h->ci) *index = (unsigned)k;
    } else {
        *index = (unsigned)enumerated_index(h->gpu);
    }
    END();
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(void *device, unsigned int *minor)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!minor) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *minor = (unsigned)g->minor;
    END();
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci)
{
    BEGIN();
    handle_t *h = as_dev(device);
    if (!h || !pci) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    FAULT(h->gpu);
    const gpu_t *g = &g_fx.gpus[h->gpu];
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", g->domain, g->bus, g->dev, g->func);
    copy_str(pci->busId, sizeof pci->busId, g->bus_id);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = g->pci_dev_id;
    pci->pciSubSystemId = g->pci_sub_id;
    END();
}

/* ------------------------------------------------------------------ */
/* Memory, NUMA, affinity                                              */

/* used/reserved/total in MiB for a device handle. */
static int mem_of(handle_t *h, const gpu_t *g, unsigned long long *total, unsigned long long *reserved,
                  unsigned long long *used)
{
    if (h->kind == K_MIG) {
        gi_t *gi; ci_t *ci;
        int rc = mig_resolve(h, &gi, &ci);
        if (rc) return rc;
        *total = gip_by_id(g->mig, gi->profile_id)->mem_mb;
        *reserved = 0;
        *used = 0;
        for (int k = 0; k < g_st[h->gpu].nproc; k++)
            if (g_st[h->gpu].proc[k].gi == gi->id) *used += g_st[h->gpu].proc[k].mem_mib;
        return NVML_SUCCESS;
    }
    state_snapshot();
    if (g_st[h->gpu].mig_cur && !mig_monitor_allowed()) return NVML_ERROR_NO_PERMISSION;
    *total = g->mem_total;
    *reserved = g->mem_reserved;
    *used = g->mem_used;
    for (int k = 0; k < g_st[h->gpu].nproc; k++) *used += g_st[h->gpu].proc[k].mem_mib;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *mem)
{
    DEV_BEGIN(device);
    if (!mem) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long t, r, u;
    if ((rc = mem_of(h, g, &t, &r, &u))) goto out;
    mem->total = t * MIB;
    mem->used = (u + r) * MIB;
    mem->free = mem->total > mem->used ? mem->total - mem->used : 0;
    END();
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *mem)
{
    DEV_BEGIN(device);
    if (!mem) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (mem->version != nvmlMemory_v2) FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long t, r, u;
    if ((rc = mem_of(h, g, &t, &r, &u))) goto out;
    mem->total = t * MIB;
    mem->reserved = r * MIB;
    mem->used = u * MIB;
    mem->free = t > r + u ? (t - r - u) * MIB : 0;
    END();
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(void *device, unsigned int *node)
{
    DEV_BEGIN(device);
    /* Only where the GPU's memory is a NUMA node of its own (Grace Hopper, Grace Blackwell); NOT_SUPPORTED as on
       x86 PCIe/SXM systems otherwise. */
    if (g->memory_numa < 0) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (!node) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *node = (unsigned int)g->memory_numa;
    END();
}

API nvmlReturn_t nvmlDeviceGetCpuAffinity(void *device, unsigned int n, unsigned long *set)
{
    DEV_BEGIN(device);
    if (!set || n == 0) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 0; i < n; i++) set[i] = i < MAXCPUWORDS ? (unsigned long)g->cpus[i] : 0;
    END();
}

API nvmlReturn_t nvmlDeviceGetMemoryAffinity(void *device, unsigned int n, unsigned long *set, unsigned int scope)
{
    DEV_BEGIN(device);
    if (!set || n == 0 || scope > 1) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (g->numa < 0) FAIL(NVML_ERROR_NOT_SUPPORTED);
    memset(set, 0, n * sizeof *set);
    if ((unsigned)g->numa / 64 < n) set[g->numa / 64] = 1UL << (g->numa % 64);
    END();
}

/* ------------------------------------------------------------------ */
/* PCIe, NVLink, topology                                              */

#define PCIE_GETTER(fn, field)                                    \
    API nvmlReturn_t fn(void *device, unsigned int *v)            \
    {                                                             \
        DEV_BEGIN(device);                                        \
        PHYS_ONLY();                                              \
        if (!v) FAIL(NVML_ERROR_INVALID_ARGUMENT);                \
        if (!g->has_pcie) FAIL(NVML_ERROR_NOT_SUPPORTED);         \
        *v = (unsigned)g->field;                                  \
        END();                                                    \
    }
PCIE_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, gen_cur)
PCIE_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, gen_max)
PCIE_GETTER(nvmlDeviceGetCurrPcieLinkWidth, width_cur)
PCIE_GETTER(nvmlDeviceGetMaxPcieLinkWidth, width_max)

API nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned int link, unsigned int *active)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!active) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (g->nvlinks <= 0) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (unsigned)g->nvlinks) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *active = (g->nvlink_down >> link) & 1 ? 0 : 1;
    END();
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(void *d1, void *d2, int *level)
{
    BEGIN();
    handle_t *a = as_dev(d1), *b = as_dev(d2);
    if (!a || !b || !level) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    FAULT(a->gpu);
    if (b->gpu != a->gpu) FAULT(b->gpu);
    const gpu_t *ga = &g_fx.gpus[a->gpu], *gb = &g_fx.gpus[b->gpu];
    if (ga->lost || gb->lost) FAIL(NVML_ERROR_GPU_IS_LOST);
    if (a->gpu == b->gpu) *level = 0;
    else if (ga->pcie_switch >= 0 && ga->pcie_switch == gb->pcie_switch) *level = 10;
    else if (ga->numa >= 0 && ga->numa == gb->numa) *level = 40;
    else *level = 50;
    END();
}

/* ------------------------------------------------------------------ */
/* ECC, remapped rows, misc                                            */

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, unsigned int type, unsigned int counter,
                                             unsigned long long *count)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!count || type > 1 || counter > 1) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->has_ecc) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *count = g->ecc[type][counter];
    END();
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned int *corr, unsigned int *unc,
                                           unsigned int *pending, unsigned int *failure)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!corr || !unc || !pending || !failure) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->has_rr) FAIL(NVML_ERROR_NOT_SUPPORTED);
    state_snapshot();
    if (g_st[h->gpu].mig_cur && g_st[h->gpu].ngi) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *corr = g->rr_corr;
    *unc = g->rr_unc;
    *pending = g->rr_pending;
    *failure = g->rr_failure;
    END();
}

API nvmlReturn_t nvmlDeviceGetPersistenceMode(void *device, unsigned int *mode)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!mode) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *mode = (unsigned)g->persistence;
    END();
}

API nvmlReturn_t nvmlDeviceGetTemperature(void *device, unsigned int sensor, unsigned int *temp)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!temp || sensor != 0) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *temp = (unsigned)g->temperature;
    END();
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *mw)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!mw) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *mw = (unsigned)g->power_mw;
    END();
}

/* ------------------------------------------------------------------ */
/* Processes                                                           */

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    DEV_BEGIN(device);
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    gi_t *gi = NULL; ci_t *ci = NULL;
    if (mig) { if ((rc = mig_resolve(h, &gi, &ci))) goto out; }
    else state_snapshot();
    gstate_t *s = &g_st[h->gpu];
    unsigned n = 0;
    proc_t sel[MAXPROC];
    for (int k = 0; k < s->nproc; k++) {
        const proc_t *p = &s->proc[k];
        if (mig && (p->gi != gi->id || (p->ci >= 0 && p->ci != ci->id))) continue;
        sel[n++] = *p;
    }
    if (!infos || *count < n) {
        *count = n;
        FAIL(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    for (unsigned k = 0; k < n; k++) {
        infos[k].pid = sel[k].pid;
        infos[k].usedGpuMemory = sel[k].mem_mib * MIB;
        infos[k].gpuInstanceId = (s->mig_cur && sel[k].gi >= 0) ? (unsigned)sel[k].gi : NA_ID;
        infos[k].computeInstanceId = (s->mig_cur && sel[k].ci >= 0) ? (unsigned)sel[k].ci : NA_ID;
    }
    *count = n;
    END();
}

/* ------------------------------------------------------------------ */
/* MIG mode                                                            */

API nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned int *cur, unsigned int *pend)
{
    DEV_BEGIN(device);
    if (mig) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!cur || !pend) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig) FAIL(NVML_ERROR_NOT_SUPPORTED);
    state_snapshot();
    *cur = (unsigned)g_st[h->gpu].mig_cur;
    *pend = (unsigned)g_st[h->gpu].mig_pend;
    END();
}

API nvmlReturn_t nvmlDeviceSetMigMode(void *device, unsigned int mode, nvmlReturn_t *activation)
{
    DEV_BEGIN(device);
    if (mig || !activation || mode > 1) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (geteuid() != 0) FAIL(NVML_ERROR_NO_PERMISSION);
    int fd = state_lock(1), exists;
    if (fd < 0) FAIL(NVML_ERROR_NO_PERMISSION);
    state_read(&exists);
    gstate_t *s = &g_st[h->gpu];
    if (s->mig_cur == (int)mode) {
        s->mig_pend = (int)mode;     /* cancels a pending change */
        *activation = NVML_SUCCESS;
    } else if (s->nproc > 0) {
        s->mig_pend = (int)mode;     /* needs a GPU reset once clients are gone */
        *activation = NVML_ERROR_IN_USE;
    } else {
        s->mig_cur = s->mig_pend = (int)mode;
        s->ngi = 0;
        *activation = NVML_SUCCESS;
    }
    rc = state_write();
    state_unlock(fd);
    END();
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned int *count)
{
    DEV_BEGIN(device);
    if (mig || !count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig) FAIL(NVML_ERROR_NOT_SUPPORTED);
    state_snapshot();
    *count = g_st[h->gpu].mig_cur ? 7 : 0;
    END();
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *device, unsigned int *isMig)
{
    BEGIN();
    handle_t *h = as_dev(device);
    if (!h || !isMig) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    FAULT(h->gpu);
    *isMig = h->kind == K_MIG;
    END();
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, void **migDevice)
{
    DEV_BEGIN(device);
    if (mig || !migDevice) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (index >= 7) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    state_snapshot();
    gstate_t *s = &g_st[h->gpu];
    if (!s->mig_cur) FAIL(NVML_ERROR_NOT_SUPPORTED);
    int gis[64], cis[64], n = mig_list(s, gis, cis);
    if ((int)index >= n) FAIL(NVML_ERROR_NOT_FOUND);
    *migDevice = mk(&H_MIG[h->gpu][gis[index]][cis[index]], K_MIG, h->gpu, gis[index], cis[index]);
    END();
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *migDevice, void **device)
{
    BEGIN();
    handle_t *h = as_kind(migDevice, K_MIG);
    if (!h || !device) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    FAULT(h->gpu);
    if ((rc = mig_resolve(h, NULL, NULL))) goto out;
    *device = mk(&H_GPU[h->gpu], K_GPU, h->gpu, -1, -1);
    END();
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *device, unsigned int *id)
{
    DEV_BEGIN(device);
    if (!id) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if ((rc = mig_resolve(h, NULL, NULL))) goto out;
    *id = (unsigned)h->gi;
    END();
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *device, unsigned int *id)
{
    DEV_BEGIN(device);
    if (!id) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if ((rc = mig_resolve(h, NULL, NULL))) goto out;
    *id = (unsigned)h->ci;
    END();
}

/* ------------------------------------------------------------------ */
/* GPU instances                                                       */

/* Common checks for MIG management on a physical GPU handle. */
#define MIG_DEV_BEGIN(d) DEV_BEGIN(d); if (mig) FAIL(NVML_ERROR_INVALID_ARGUMENT); \
    if (!g->mig) FAIL(NVML_ERROR_NOT_SUPPORTED)

static int count_profile(const gstate_t *s, int pid)
{
    int n = 0;
    for (int k = 0; k < s->ngi; k++) n += s->gi[k].profile_id == pid;
    return n;
}

static unsigned gi_mask(const gstate_t *s, int *cslices, const miptable_t *t)
{
    unsigned m = 0;
    *cslices = 0;
    for (int k = 0; k < s->ngi; k++) {
        m |= ((1u << s->gi[k].size) - 1) << s->gi[k].start;
        const gip_t *p = gip_by_id(t, s->gi[k].profile_id);
        *cslices += p ? p->cslices : 0;
    }
    return m;
}

static int gi_fits(const gstate_t *s, const gip_t *p, int start, const miptable_t *t)
{
    int used;
    unsigned m = gi_mask(s, &used, t), want = ((1u << p->msize) - 1) << start;
    return !(m & want) && used + p->cslices <= 7 && count_profile(s, p->id) < p->maxinst &&
           !find_gi((gstate_t *)s, gi_buddy_id(start, p->msize));
}

static void fill_gip(const gip_t *p, const gstate_t *s, unsigned *id, unsigned *slices, unsigned *inst,
                     unsigned *sm, unsigned *ce, unsigned *dec, unsigned *enc, unsigned *jpeg, unsigned *ofa,
                     unsigned long long *mem)
{
    (void)s;
    *id = (unsigned)p->id; *slices = (unsigned)p->cslices; *inst = (unsigned)p->maxinst;
    *sm = (unsigned)p->sm; *ce = (unsigned)p->ce; *dec = (unsigned)p->dec; *enc = (unsigned)p->enc;
    *jpeg = (unsigned)p->jpeg; *ofa = (unsigned)p->ofa; *mem = p->mem_mb;
}

/* A MIG-capable GPU's profile table is answered whatever its MIG mode, and an enum past the last one
 * (NVML_GPU_INSTANCE_PROFILE_COUNT, 0x11) is INVALID_ARGUMENT: as the real H200 answered with MIG disabled
 * (driver 580.159.04, tools/gpu_reality_check.py, 2026-12-04). */
static int gip_lookup(const gpu_t *g, unsigned profile, const gip_t **out)
{
    if (profile >= 0x11) return NVML_ERROR_INVALID_ARGUMENT;
    *out = gip_by_enum(g->mig, (int)profile);
    return *out ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(void *device, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info)
{
    MIG_DEV_BEGIN(device);
    if (!info) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    const gip_t *p;
    if ((rc = gip_lookup(g, profile, &p))) goto out;
    memset(info, 0, sizeof *info);
    fill_gip(p, NULL, &info->id, &info->sliceCount, &info->instanceCount, &info->multiprocessorCount,
             &info->copyEngineCount, &info->decoderCount, &info->encoderCount, &info->jpegCount, &info->ofaCount,
             &info->memorySizeMB);
    END();
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *device, unsigned int profile, void *vinfo)
{
    MIG_DEV_BEGIN(device);
    if (!vinfo) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    unsigned version = *(unsigned *)vinfo;
    if (version != GIP_V2 && version != GIP_V3) FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    const gip_t *p;
    if ((rc = gip_lookup(g, profile, &p))) goto out;
    char name[96];
    snprintf(name, sizeof name, "MIG %s", p->name);
    if (version == GIP_V2) {
        nvmlGpuInstanceProfileInfo_v2_t *i = vinfo;
        memset(i, 0, sizeof *i);
        i->version = version;
        fill_gip(p, NULL, &i->id, &i->sliceCount, &i->instanceCount, &i->multiprocessorCount, &i->copyEngineCount,
                 &i->decoderCount, &i->encoderCount, &i->jpegCount, &i->ofaCount, &i->memorySizeMB);
        copy_str(i->name, sizeof i->name, name);
    } else {
        nvmlGpuInstanceProfileInfo_v3_t *i = vinfo;
        memset(i, 0, sizeof *i);
        i->version = version;
        fill_gip(p, NULL, &i->id, &i->sliceCount, &i->instanceCount, &i->multiprocessorCount, &i->copyEngineCount,
                 &i->decoderCount, &i->encoderCount, &i->jpegCount, &i->ofaCount, &i->memorySizeMB);
        copy_str(i->name, sizeof i->name, name);
        i->capabilities = 0;
    }
    END();
}

/* Resolve a profile *id* on an enabled GPU. */
static int gip_by_id_checked(handle_t *h, const gpu_t *g, unsigned pid, const gip_t **out)
{
    state_snapshot();
    if (!g_st[h->gpu].mig_cur) return NVML_ERROR_NOT_SUPPORTED;
    *out = gip_by_id(g->mig, (int)pid);
    return *out ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *device, unsigned int pid,
                                                               nvmlPlacement_t *placements, unsigned int *count)
{
    MIG_DEV_BEGIN(device);
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    /* Answered with MIG disabled too (the real H200, as gip_lookup). */
    const gip_t *p = gip_by_id(g->mig, (int)pid);
    if (!p) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (placements)
        for (int k = 0; k < p->nstarts; k++) {
            placements[k].start = (unsigned)p->starts[k];
            placements[k].size = (unsigned)p->msize;
        }
    *count = (unsigned)p->nstarts;
    END();
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(void *device, unsigned int pid, unsigned int *count)
{
    MIG_DEV_BEGIN(device);
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    const gip_t *p;
    if ((rc = gip_by_id_checked(h, g, pid, &p))) goto out;
    /* Greedy count of how many more instances fit. */
    gstate_t tmp = g_st[h->gpu];
    unsigned n = 0;
    for (int k = 0; k < p->nstarts && tmp.ngi < MAXGI; k++) {
        if (!gi_fits(&tmp, p, p->starts[k], g->mig)) continue;
        gi_t *gi = &tmp.gi[tmp.ngi++];
        memset(gi, 0, sizeof *gi);
        gi->profile_id = p->id; gi->start = p->starts[k]; gi->size = p->msize;
        gi->id = gi_buddy_id(gi->start, gi->size);
        n++;
    }
    *count = n;
    END();
}

static int create_gi(handle_t *h, const gpu_t *g, unsigned pid, const nvmlPlacement_t *pl, void **out)
{
    const gip_t *p;
    int rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = gip_by_id_checked(h, g, pid, &p))) return rc;
    if (pl) {
        int ok = 0;
        for (int k = 0; k < p->nstarts; k++) ok |= p->starts[k] == (int)pl->start;
        if (!ok || pl->size != (unsigned)p->msize) return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (!mig_admin_allowed()) return NVML_ERROR_NO_PERMISSION;
    int fd = state_lock(1), exists;
    if (fd < 0) return NVML_ERROR_NO_PERMISSION;
    state_read(&exists);
    gstate_t *s = &g_st[h->gpu];
    int start = -1;
    if (!s->mig_cur) rc = NVML_ERROR_NOT_SUPPORTED;
    else if (pl) start = gi_fits(s, p, (int)pl->start, g->mig) ? (int)pl->start : -1;
    else
        for (int k = 0; k < p->nstarts && start < 0; k++)
            if (gi_fits(s, p, p->starts[k], g->mig)) start = p->starts[k];
    if (!rc && start < 0) rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!rc) {
        gi_t *gi = &s->gi[s->ngi++];
        memset(gi, 0, sizeof *gi);
        gi->profile_id = p->id;
        gi->start = start;
        gi->size = p->msize;
        gi->id = gi_buddy_id(start, p->msize);
        rc = state_write();
        if (!rc) *out = mk(&H_GI[h->gpu][gi->id], K_GI, h->gpu, gi->id, -1);
    }
    state_unlock(fd);
    return rc;
}

API nvmlReturn_t nvmlDeviceCreateGpuInstance(void *device, unsigned int pid, void **gpuInstance)
{
    MIG_DEV_BEGIN(device);
    rc = create_gi(h, g, pid, NULL, gpuInstance);
    END();
}

API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *device, unsigned int pid,
                                                          const nvmlPlacement_t *placement, void **gpuInstance)
{
    MIG_DEV_BEGIN(device);
    if (!placement) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    rc = create_gi(h, g, pid, placement, gpuInstance);
    END();
}

API nvmlReturn_t nvmlDeviceGetGpuInstances(void *device, unsigned int pid, void **gis, unsigned int *count)
{
    MIG_DEV_BEGIN(device);
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    const gip_t *p;
    if ((rc = gip_by_id_checked(h, g, pid, &p))) goto out;
    const gstate_t *s = &g_st[h->gpu];
    unsigned n = 0;
    for (int id = 0; id < MAXGI; id++) {
        gi_t *gi = find_gi((gstate_t *)s, id);
        if (!gi || gi->profile_id != p->id) continue;
        if (gis) gis[n] = mk(&H_GI[h->gpu][id], K_GI, h->gpu, id, -1);
        n++;
    }
    *count = n;
    END();
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *device, unsigned int id, void **gpuInstance)
{
    MIG_DEV_BEGIN(device);
    if (!gpuInstance) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    state_snapshot();
    if (!g_st[h->gpu].mig_cur) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (id >= MAXGI || !find_gi(&g_st[h->gpu], (int)id)) FAIL(NVML_ERROR_NOT_FOUND);
    *gpuInstance = mk(&H_GI[h->gpu][id], K_GI, h->gpu, (int)id, -1);
    END();
}

/* Entry for GI-handle calls: h, g, gi (from a fresh snapshot). */
#define GI_BEGIN(x) BEGIN(); handle_t *h = as_kind(x, K_GI); if (!h) FAIL(NVML_ERROR_INVALID_ARGUMENT); \
    FAULT(h->gpu); gpu_t *g = &g_fx.gpus[h->gpu]; if (g->lost) FAIL(NVML_ERROR_GPU_IS_LOST); \
    state_snapshot(); gi_t *gi = g_st[h->gpu].mig_cur ? find_gi(&g_st[h->gpu], h->gi) : NULL; \
    if (!gi) FAIL(NVML_ERROR_INVALID_ARGUMENT); \
    const gip_t *gp = gip_by_id(g->mig, gi->profile_id); (void)gp

API nvmlReturn_t nvmlGpuInstanceGetInfo(void *gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    GI_BEGIN(gpuInstance);
    if (!info) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    info->device = mk(&H_GPU[h->gpu], K_GPU, h->gpu, -1, -1);
    info->id = (unsigned)gi->id;
    info->profileId = (unsigned)gi->profile_id;
    info->placement.start = (unsigned)gi->start;
    info->placement.size = (unsigned)gi->size;
    END();
}

static int gpu_has_gi_procs(const gstate_t *s, int giid)
{
    for (int k = 0; k < s->nproc; k++)
        if (s->proc[k].gi == giid) return 1;
    return 0;
}

API nvmlReturn_t nvmlGpuInstanceDestroy(void *gpuInstance)
{
    GI_BEGIN(gpuInstance);
    if (!mig_admin_allowed()) FAIL(NVML_ERROR_NO_PERMISSION);
    int fd = state_lock(1), exists;
    if (fd < 0) FAIL(NVML_ERROR_NO_PERMISSION);
    state_read(&exists);
    gstate_t *s = &g_st[h->gpu];
    gi = s->mig_cur ? find_gi(s, h->gi) : NULL;
    if (!gi) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (gi->nci > 0 || gpu_has_gi_procs(s, gi->id)) rc = NVML_ERROR_IN_USE;
    else {
        *gi = s->gi[--s->ngi];
        rc = state_write();
    }
    state_unlock(fd);
    END();
}

static int cip_lookup(const gip_t *gp, unsigned profile, unsigned eng, int *slices)
{
    if (profile >= 9 || eng != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (profile >= NCIPROF || !ci_allowed(gp->cslices, CI_SLICES[profile])) return NVML_ERROR_NOT_SUPPORTED;
    *slices = CI_SLICES[profile];
    return NVML_SUCCESS;
}

static void fill_cip(const gip_t *gp, int pid, int c, unsigned *id, unsigned *sl, unsigned *inst, unsigned *sm,
                     unsigned *ce, unsigned *dec, unsigned *enc, unsigned *jpeg, unsigned *ofa)
{
    int starts[8];
    *id = (unsigned)pid; *sl = (unsigned)c; *inst = (unsigned)ci_placements(gp->cslices, c, starts);
    *sm = (unsigned)(gp->sm / gp->cslices * c);
    *ce = (unsigned)gp->ce; *dec = (unsigned)gp->dec; *enc = (unsigned)gp->enc;
    *jpeg = (unsigned)gp->jpeg; *ofa = (unsigned)gp->ofa;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(void *gpuInstance, unsigned int profile,
                                                              unsigned int eng, nvmlComputeInstanceProfileInfo_t *info)
{
    GI_BEGIN(gpuInstance);
    int c;
    if (!info) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = cip_lookup(gp, profile, eng, &c))) goto out;
    memset(info, 0, sizeof *info);
    fill_cip(gp, (int)profile, c, &info->id, &info->sliceCount, &info->instanceCount, &info->multiprocessorCount,
             &info->sharedCopyEngineCount, &info->sharedDecoderCount, &info->sharedEncoderCount,
             &info->sharedJpegCount, &info->sharedOfaCount);
    END();
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(void *gpuInstance, unsigned int profile,
                                                               unsigned int eng, void *vinfo)
{
    GI_BEGIN(gpuInstance);
    int c;
    if (!vinfo) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    unsigned version = *(unsigned *)vinfo;
    if (version != CIP_V2 && version != CIP_V3) FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if ((rc = cip_lookup(gp, profile, eng, &c))) goto out;
    nvmlComputeInstanceProfileInfo_v3_t *i = vinfo; /* v2 is a prefix of v3 */
    memset(i, 0, version == CIP_V2 ? sizeof(nvmlComputeInstanceProfileInfo_v2_t) : sizeof *i);
    i->version = version;
    fill_cip(gp, (int)profile, c, &i->id, &i->sliceCount, &i->instanceCount, &i->multiprocessorCount,
             &i->sharedCopyEngineCount, &i->sharedDecoderCount, &i->sharedEncoderCount, &i->sharedJpegCount,
             &i->sharedOfaCount);
    char cn[64];
    ci_name(gp, c, cn, sizeof cn);
    snprintf(i->name, sizeof i->name, "MIG %s", cn);
    END();
}

static unsigned ci_mask(const gi_t *gi)
{
    unsigned m = 0;
    for (int k = 0; k < gi->nci; k++) m |= ((1u << gi->ci[k].size) - 1) << gi->ci[k].start;
    return m;
}

static int ci_count_profile(const gi_t *gi, int pid)
{
    int n = 0;
    for (int k = 0; k < gi->nci; k++) n += gi->ci[k].profile_id == pid;
    return n;
}

static int ci_fits(const gi_t *gi, int c, int start)
{
    return !(ci_mask(gi) & (((1u << c) - 1) << start));
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(void *gpuInstance, unsigned int profile,
                                                                     nvmlPlacement_t *placements, unsigned int *count)
{
    GI_BEGIN(gpuInstance);
    int c, starts[8];
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = cip_lookup(gp, profile, 0, &c))) goto out;
    int n = ci_placements(gp->cslices, c, starts);
    if (placements)
        for (int k = 0; k < n; k++) { placements[k].start = (unsigned)starts[k]; placements[k].size = (unsigned)c; }
    *count = (unsigned)n;
    END();
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(void *gpuInstance, unsigned int profile,
                                                                    unsigned int *count)
{
    GI_BEGIN(gpuInstance);
    int c, starts[8];
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = cip_lookup(gp, profile, 0, &c))) goto out;
    int n = ci_placements(gp->cslices, c, starts);
    gi_t tmp = *gi;
    unsigned free_n = 0;
    for (int k = 0; k < n && tmp.nci < MAXCI; k++) {
        if (!ci_fits(&tmp, c, starts[k])) continue;
        tmp.ci[tmp.nci++] = (ci_t){ 0, (int)profile, starts[k], c };
        free_n++;
    }
    *count = free_n;
    END();
}

static int create_ci(handle_t *h, unsigned profile, const nvmlPlacement_t *pl, void **out)
{
    const gpu_t *g = &g_fx.gpus[h->gpu];
    int rc, c, starts[8], exists;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_admin_allowed()) return NVML_ERROR_NO_PERMISSION;
    int fd = state_lock(1);
    if (fd < 0) return NVML_ERROR_NO_PERMISSION;
    state_read(&exists);
    gstate_t *s = &g_st[h->gpu];
    gi_t *gi = s->mig_cur ? find_gi(s, h->gi) : NULL;
    const gip_t *gp = gi ? gip_by_id(g->mig, gi->profile_id) : NULL;
    if (!gi || !gp) { rc = NVML_ERROR_INVALID_ARGUMENT; goto done; }
    if ((rc = cip_lookup(gp, profile, 0, &c))) goto done;
    int n = ci_placements(gp->cslices, c, starts), start = -1;
    if (pl) {
        int ok = 0;
        for (int k = 0; k < n; k++) ok |= starts[k] == (int)pl->start;
        if (!ok || pl->size != (unsigned)c) { rc = NVML_ERROR_INVALID_ARGUMENT; goto done; }
        if (ci_fits(gi, c, (int)pl->start)) start = (int)pl->start;
    } else {
        for (int k = 0; k < n && start < 0; k++)
            if (ci_fits(gi, c, starts[k])) start = starts[k];
    }
    if (start < 0 || ci_count_profile(gi, (int)profile) >= n || gi->nci >= MAXCI) {
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
        goto done;
    }
    int id = 0;
    while (find_ci(gi, id)) id++;
    gi->ci[gi->nci++] = (ci_t){ id, (int)profile, start, c };
    rc = state_write();
    if (!rc) *out = mk(&H_CI[h->gpu][gi->id][id], K_CI, h->gpu, gi->id, id);
done:
    state_unlock(fd);
    return rc;
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *gpuInstance, unsigned int profile, void **ci)
{
    GI_BEGIN(gpuInstance);
    rc = create_ci(h, profile, NULL, ci);
    END();
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(void *gpuInstance, unsigned int profile,
                                                                   const nvmlPlacement_t *placement, void **ci)
{
    GI_BEGIN(gpuInstance);
    if (!placement) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    rc = create_ci(h, profile, placement, ci);
    END();
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(void *gpuInstance, unsigned int profile, void **cis,
                                                    unsigned int *count)
{
    GI_BEGIN(gpuInstance);
    int c;
    if (!count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = cip_lookup(gp, profile, 0, &c))) goto out;
    unsigned n = 0;
    for (int id = 0; id < MAXCI; id++) {
        ci_t *ci = find_ci(gi, id);
        if (!ci || ci->profile_id != (int)profile) continue;
        if (cis) cis[n] = mk(&H_CI[h->gpu][gi->id][id], K_CI, h->gpu, gi->id, id);
        n++;
    }
    *count = n;
    END();
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void *gpuInstance, unsigned int id, void **ci)
{
    GI_BEGIN(gpuInstance);
    if (!ci) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (id >= MAXCI || !find_ci(gi, (int)id)) FAIL(NVML_ERROR_NOT_FOUND);
    *ci = mk(&H_CI[h->gpu][gi->id][id], K_CI, h->gpu, gi->id, (int)id);
    END();
}

/* Entry for CI-handle calls: h, g, gi, ci. */
#define CI_BEGIN(x) BEGIN(); handle_t *h = as_kind(x, K_CI); if (!h) FAIL(NVML_ERROR_INVALID_ARGUMENT); \
    FAULT(h->gpu); gpu_t *g = &g_fx.gpus[h->gpu]; if (g->lost) FAIL(NVML_ERROR_GPU_IS_LOST); \
    state_snapshot(); gi_t *gi = g_st[h->gpu].mig_cur ? find_gi(&g_st[h->gpu], h->gi) : NULL; \
    ci_t *ci = find_ci(gi, h->ci); if (!ci) FAIL(NVML_ERROR_INVALID_ARGUMENT)

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *computeInstance, nvmlComputeInstanceInfo_t *info)
{
    CI_BEGIN(computeInstance);
    if (!info) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    info->device = mk(&H_GPU[h->gpu], K_GPU, h->gpu, -1, -1);
    info->gpuInstance = mk(&H_GI[h->gpu][gi->id], K_GI, h->gpu, gi->id, -1);
    info->id = (unsigned)ci->id;
    info->profileId = (unsigned)ci->profile_id;
    info->placement.start = (unsigned)ci->start;
    info->placement.size = (unsigned)ci->size;
    END();
}

API nvmlReturn_t nvmlComputeInstanceGetInfo(void *ci, nvmlComputeInstanceInfo_t *info) { return nvmlComputeInstanceGetInfo_v2(ci, info); }

API nvmlReturn_t nvmlComputeInstanceDestroy(void *computeInstance)
{
    CI_BEGIN(computeInstance);
    (void)ci;
    if (!mig_admin_allowed()) FAIL(NVML_ERROR_NO_PERMISSION);
    int fd = state_lock(1), exists;
    if (fd < 0) FAIL(NVML_ERROR_NO_PERMISSION);
    state_read(&exists);
    gstate_t *s = &g_st[h->gpu];
    gi = s->mig_cur ? find_gi(s, h->gi) : NULL;
    ci_t *c = find_ci(gi, h->ci);
    int busy = 0;
    for (int k = 0; c && k < s->nproc; k++)
        busy |= s->proc[k].gi == gi->id && s->proc[k].ci == c->id;
    if (!c) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (busy) rc = NVML_ERROR_IN_USE;
    else {
        *c = gi->ci[--gi->nci];
        rc = state_write();
    }
    state_unlock(fd);
    END();
}

/* ------------------------------------------------------------------ */
/* What the NVIDIA k8s-device-plugin calls beyond pynvml (go-nvml)     */

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor)
{
    DEV_BEGIN(device);
    if (!major || !minor) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->cc_major) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *major = g->cc_major;
    *minor = g->cc_minor;
    END();
}

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "device attributes");

/* MIG device handles only (nvml.h: "This API currently only supports MIG device handles"). */
static int attributes_impl(void *device, nvmlDeviceAttributes_t *a)
{
    DEV_BEGIN(device);
    if (!a) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig) FAIL(NVML_ERROR_NOT_SUPPORTED);
    gi_t *gi; ci_t *ci;
    if ((rc = mig_resolve(h, &gi, &ci))) goto out;
    const gip_t *p = gip_by_id(g->mig, gi->profile_id);
    if (!p) FAIL(NVML_ERROR_UNKNOWN);
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = (unsigned)(p->sm / p->cslices * ci->size);
    a->sharedCopyEngineCount = (unsigned)p->ce;
    a->sharedDecoderCount = (unsigned)p->dec;
    a->sharedEncoderCount = (unsigned)p->enc;
    a->sharedJpegCount = (unsigned)p->jpeg;
    a->sharedOfaCount = (unsigned)p->ofa;
    a->gpuInstanceSliceCount = (unsigned)p->cslices;
    a->computeInstanceSliceCount = (unsigned)ci->size;
    a->memorySizeMB = p->mem_mb;
    END();
}

API nvmlReturn_t nvmlDeviceGetAttributes_v2(void *device, nvmlDeviceAttributes_t *a) { return attributes_impl(device, a); }
API nvmlReturn_t nvmlDeviceGetAttributes(void *device, nvmlDeviceAttributes_t *a) { return attributes_impl(device, a); }

/* The far end of an NVLink: nvlink.remote[link] from the fixture (a GPU's bus id gets that GPU's
 * PCI ids), else a synthetic NVSwitch on bus 0xC0 + link % 6. */
static int remote_pci_impl(void *device, unsigned int link, nvmlPciInfo_t *pci)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!pci) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (g->nvlinks <= 0) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (unsigned)g->nvlinks) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    unsigned d = 0, b = 0xC0 + link % 6, v = 0, f = 0, devid = g->cc_major >= 9 ? 0x22A310DE : 0x1AF110DE, sub = 0;
    if ((int)link < g->nremote && g->nvlink_remote[link][0]) {
        parse_busid(g->nvlink_remote[link], &d, &b, &v, &f);
        devid = sub = 0;
        for (int i = 0; i < g_fx.ngpus; i++) {
            const gpu_t *o = &g_fx.gpus[i];
            if (o->domain == d && o->bus == b && o->dev == v && o->func == f) {
                devid = o->pci_dev_id;
                sub = o->pci_sub_id;
            }
        }
    }
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", d, b, v, f);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", d, b, v, f);
    pci->domain = d;
    pci->bus = b;
    pci->device = v;
    pci->pciDeviceId = devid;
    pci->pciSubSystemId = sub;
    END();
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *device, unsigned int link, nvmlPciInfo_t *pci)
{
    return remote_pci_impl(device, link, pci);
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(void *device, unsigned int link, nvmlPciInfo_t *pci)
{
    return remote_pci_impl(device, link, pci);
}

/* ------------------------------------------------------------------ */
/* Events                                                              */
/*
 * Events are lines appended to "<state>.events" (nvml_double_ctl.py inject-xid):
 *   {"uuid": "GPU-...", "type": 8, "data": 79, "gpu_instance_id": N, "compute_instance_id": N}
 * An event set starts at the file's end when it is created, so it sees only later events, and
 * nvmlEventSetWait polls the file (every 10 ms) without holding the library's mutex.
 */

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
_Static_assert(sizeof(nvmlEventData_t) == 32, "event data");

#define MAXEVSET 64
typedef struct { int used; long long cursor; unsigned long long mask[MAXG]; } evset_t;
static evset_t EVSETS[MAXEVSET];

static evset_t *as_evset(void *p)
{
    evset_t *s = p;
    if (!p || !IN_ARRAY(p, EVSETS) || ((const char *)p - (const char *)EVSETS) % sizeof(evset_t) || !s->used)
        return NULL;
    return s;
}

static void events_path(char *out, size_t n)
{
    snprintf(out, n, "%s.events", g_state_path);
}

static long long events_size(void)
{
    char ep[PATH_MAX];
    struct stat st;
    events_path(ep, sizeof ep);
    return stat(ep, &st) == 0 ? (long long)st.st_size : 0;
}

API nvmlReturn_t nvmlEventSetCreate(void **set)
{
    BEGIN();
    FAULT(-1);
    if (!set) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAXEVSET; i++) {
        if (EVSETS[i].used) continue;
        memset(&EVSETS[i], 0, sizeof EVSETS[i]);
        EVSETS[i].used = 1;
        EVSETS[i].cursor = events_size();
        *set = &EVSETS[i];
        goto out;
    }
    rc = NVML_ERROR_MEMORY;
    END();
}

API nvmlReturn_t nvmlEventSetFree(void *set)
{
    BEGIN();
    FAULT(-1);
    evset_t *s = as_evset(set);
    if (!s) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    s->used = 0;
    END();
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    if (!types) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *types = g->event_types;
    END();
}

API nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set)
{
    DEV_BEGIN(device);
    PHYS_ONLY();
    evset_t *s = as_evset(set);
    if (!s) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~g->event_types) FAIL(NVML_ERROR_NOT_SUPPORTED);
    s->mask[h->gpu] |= types;
    END();
}

/* One pass over the events after s->cursor: 1 and *data filled when one matched. Holds g_mu. */
static int events_poll(evset_t *s, nvmlEventData_t *data, int full)
{
    char ep[PATH_MAX];
    events_path(ep, sizeof ep);
    if (events_size() < s->cursor) s->cursor = 0; /* the file was replaced */
    FILE *f = fopen(ep, "rb");
    if (!f) return 0;
    int found = 0;
    char line[1024];
    if (fseeko(f, (off_t)s->cursor, SEEK_SET) == 0) {
        while (!found && fgets(line, sizeof line, f)) {
            size_t n = strlen(line);
            if (n == 0 || line[n - 1] != '\n') break; /* a line still being written */
            s->cursor += (long long)n;
            char err[128];
            jval *ev = json_parse(line, err, sizeof err);
            if (!ev) continue;
            const char *uuid = jstr(jget(ev, "uuid"), "");
            unsigned long long type = (unsigned long long)jint(jget(ev, "type"), 0);
            for (int i = 0; i < g_fx.ngpus && !found; i++) {
                if (strcasecmp(uuid, g_fx.gpus[i].uuid) || !(s->mask[i] & type)) continue;
                memset(data, 0, full ? sizeof *data : offsetof(nvmlEventData_t, gpuInstanceId));
                data->device = mk(&H_GPU[i], K_GPU, i, -1, -1);
                data->eventType = type;
                data->eventData = (unsigned long long)jint(jget(ev, "data"), 0);
                if (full) {
                    data->gpuInstanceId = (unsigned)jint(jget(ev, "gpu_instance_id"), NA_ID);
                    data->computeInstanceId = (unsigned)jint(jget(ev, "compute_instance_id"), NA_ID);
                }
                found = 1;
            }
            json_free(ev);
        }
    }
    fclose(f);
    return found;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int wait_impl(const char *sym, void *set, nvmlEventData_t *data, unsigned int timeoutms, int full)
{
    long long deadline = now_ms() + timeoutms;
    for (;;) {
        int rc = NVML_SUCCESS, found = 0;
        pthread_mutex_lock(&g_mu);
        evset_t *s = as_evset(set);
        if (g_refcount <= 0) rc = NVML_ERROR_UNINITIALIZED;
        else if ((rc = fault(sym, -1))) ;
        else if (!s || !data) rc = NVML_ERROR_INVALID_ARGUMENT;
        else found = events_poll(s, data, full);
        pthread_mutex_unlock(&g_mu);
        if (rc || found) return rc;
        long long left = deadline - now_ms();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        struct timespec ts = { 0, (left < 10 ? left : 10) * 1000000L };
        nanosleep(&ts, NULL);
    }
}

API nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return wait_impl("nvmlEventSetWait_v2", set, data, timeoutms, 1);
}

/* v1: the event data had no GPU/compute instance ids. */
API nvmlReturn_t nvmlEventSetWait(void *set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return wait_impl("nvmlEventSetWait", set, data, timeoutms, 0);
}
