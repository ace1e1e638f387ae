/* The lab's stand-in for libcuda.so.1 (the CUDA driver API): the calls rigup-burnin makes
 * (roles/burnin/shipped/acceptance.py), answered for the simulated cards of tests/lab/nvidia_smi.py.
 *
 * Built by the lab (tests/lab/lab.py cuda_standin) and installed on GPU-profile hosts as
 * /usr/local/lib/libcuda.so.1, so that rigup-burnin's ctypes code runs as written. What it
 * simulates, from `nvidia-smi sim cuda` (one line per card, the faults `sim set` injects):
 * - device memory: the card's memory.total; allocations up to 64 MiB are real memory (results,
 *   counters), larger ones are accounted only: `fill` records each chunk's seed and `check`
 *   compares with it, adding the card's injected `--vram-bad` words to the count;
 * - copies between a pinned buffer (cuMemHostAlloc) and the card take the time the card's
 *   current link takes (0.85 of PCIe gen x width), so a link trained down to x1 measures as one;
 * - `burn` computes its LCG for real on the CPU (the reference the program checks); `mma_burn`
 *   (compute capability 8: every card here reports 8.x) writes the sums a real card computes;
 * - `--lost-under-load S`: S seconds after the first kernel the card falls off the bus (Xid 79
 *   through `nvidia-smi sim xid 79 -i N --lost`), and every call fails with CUDA error 999;
 * - `--cuda-hang 1`: a kernel launch never returns (a wedged card);
 * - `rand` (the soak's random operands) computes its hash for real in real allocations and records
 *   its seed in accounted ones; `mma_mem` (the soak's load without cuBLAS) writes sums derived
 *   from its operands, so that each seed's result is the same at every repeat.
 *
 * Built with -DCUBLAS_STANDIN (and linked with this libcuda.so.1) it is instead the stand-in for
 * libcublas.so.12, the calls rigup-burnin's soak makes (cublasCreate_v2, cublasGemmEx, ...): a GEMM
 * takes the time of 2 n^3 flops at 100 TFLOPS and its result is a digest of its operands' seeds
 * (lab_gemm below), and while a handle lives the card draws its power cap (`nvidia-smi sim set
 * --draw`). Faults per card, from the file $RIGUP_LAB_CUBLAS_FAULTS (default
 * /etc/rigup-lab/cublas-faults), one line each: `INDEX wrong` (a result off in one word: another
 * digest), `INDEX slow F` (each GEMM F times as long), `INDEX draw R` (draws R of its cap),
 * `INDEX refuse` (every GEMM answers CUBLAS_STATUS_ARCH_MISMATCH: a cuBLAS too new for the card).
 *   gcc -shared -fPIC -DCUBLAS_STANDIN -o libcublas.so.12 cuda_standin.c -L DIR -l:libcuda.so.1
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#ifdef CUBLAS_STANDIN
/* ---------------------------------------------------------------- libcublas.so.12 */
/* the card's faults of $RIGUP_LAB_CUBLAS_FAULTS: wrong, slow factor, draw ratio */
struct blas_fault {
    int wrong, refuse;
    double slow, draw;
};

static void blas_fault(int index, struct blas_fault *f) {
    const char *path = getenv("RIGUP_LAB_CUBLAS_FAULTS");
    char line[256], what[32];
    int i;
    double v;
    FILE *fp = fopen(path && *path ? path : "/etc/rigup-lab/cublas-faults", "r");
    *f = (struct blas_fault){0, 0, 1.0, 1.0};
    if (!fp)
        return;
    while (fgets(line, sizeof line, fp)) {
        int got = sscanf(line, "%d %31s %lf", &i, what, &v);
        if (got < 2 || i != index)
            continue;
        if (!strcmp(what, "wrong"))
            f->wrong = 1;
        else if (!strcmp(what, "refuse"))
            f->refuse = 1;
        else if (!strcmp(what, "slow") && got == 3 && v > 0)
            f->slow = v;
        else if (!strcmp(what, "draw") && got == 3 && v >= 0)
            f->draw = v;
    }
    fclose(fp);
}

int lab_gemm(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, double seconds, int wrong);   /* in libcuda.so.1 */
int lab_card_index(void);

struct handle {
    int index;
    double idle_w;
    struct blas_fault fault;
};

static void sim_draw(int index, double watts) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "nvidia-smi sim set -i %d --draw %.1f >/dev/null 2>&1", index, watts);
    if (system(cmd) != 0)
        fprintf(stderr, "cublas stand-in: %s failed\n", cmd);
}

int cublasCreate_v2(void **out) {
    struct handle *h = calloc(1, sizeof *h);
    char cmd[160], line[128];
    double cap = 0;
    FILE *f;
    if (!h)
        return 3;   /* CUBLAS_STATUS_ALLOC_FAILED */
    h->index = lab_card_index();
    if (h->index < 0) {
        free(h);
        return 1;   /* CUBLAS_STATUS_NOT_INITIALIZED */
    }
    blas_fault(h->index, &h->fault);
    snprintf(cmd, sizeof cmd, "nvidia-smi -i %d --query-gpu=power.draw,power.limit --format=csv,noheader,nounits", h->index);
    if ((f = popen(cmd, "r"))) {
        if (fgets(line, sizeof line, f) && sscanf(line, "%lf , %lf", &h->idle_w, &cap) == 2 && cap > 0)
            sim_draw(h->index, cap * h->fault.draw);
        pclose(f);
    }
    *out = h;
    return 0;
}

int cublasDestroy_v2(void *handle) {
    struct handle *h = handle;
    if (h && h->idle_w > 0)
        sim_draw(h->index, h->idle_w);
    free(h);
    return 0;
}

int cublasSetStream_v2(void *handle, void *stream) {
    (void)handle; (void)stream;
    return 0;
}

int cublasGetProperty(int type, int *value) {
    static const int version[] = {12, 4, 5};
    if (type < 0 || type > 2)
        return 7;   /* CUBLAS_STATUS_INVALID_VALUE */
    *value = version[type];
    return 0;
}

static int gemm(void *handle, int m, int n, int k, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c) {
    struct handle *h = handle;
    double s = 2.0 * m * n * k / 100e12 * h->fault.slow;
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    int rc;
    if (h->fault.refuse)
        return 8;   /* CUBLAS_STATUS_ARCH_MISMATCH: this cuBLAS does not run on the card */
    rc = lab_gemm(a, b, c, s, h->fault.wrong);
    nanosleep(&ts, NULL);
    return rc ? 14 : 0;   /* CUBLAS_STATUS_INTERNAL_ERROR */
}

int cublasGemmEx(void *handle, int ta, int tb, int m, int n, int k, const void *alpha, CUdeviceptr a, int at, int lda,
                 CUdeviceptr b, int bt, int ldb, const void *beta, CUdeviceptr c, int ct, int ldc, int compute, int algo) {
    (void)ta; (void)tb; (void)alpha; (void)at; (void)lda; (void)bt; (void)ldb; (void)beta; (void)ct; (void)ldc;
    (void)compute; (void)algo;
    return gemm(handle, m, n, k, a, b, c);
}

int cublasSgemm_v2(void *handle, int ta, int tb, int m, int n, int k, const float *alpha, CUdeviceptr a, int lda,
                   CUdeviceptr b, int ldb, const float *beta, CUdeviceptr c, int ldc) {
    (void)ta; (void)tb; (void)alpha; (void)lda; (void)ldb; (void)beta; (void)ldc;
    return gemm(handle, m, n, k, a, b, c);
}
#else

static unsigned fmix(unsigned x) {   /* rigup-burnin's rand_word, less the mask */
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}


#define MAXDEV 16
#define MAXALLOC 4096
#define REAL_MAX (64ull << 20)

struct card {
    int index;
    char bus[32];
    unsigned long long total_mib, used_mib;
    int gen, width, gen_max, width_max;
    long vram_bad;
    double lost_after;
    int hang;
};
struct alloc {
    CUdeviceptr ptr;
    size_t size;
    void *real;
    unsigned seed;
    int filled;
};

static struct card cards[MAXDEV];
static int ncards = -1, cur = -1, lost = 0;
static struct alloc allocs[MAXALLOC];
static int nallocs;
static CUdeviceptr next_ptr = 0x7f0000000000ull;
static size_t used_bytes;
static double first_kernel = -1;
static double card_clock;   /* the card's own time (s): each kernel and GEMM adds its nominal duration; events read it */
static void *pinned[64];
static size_t pinned_size[64];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int load_cards(void) {
    FILE *f = popen("nvidia-smi sim cuda 2>/dev/null", "r");
    char line[512];
    if (!f)
        return 0;
    ncards = 0;
    while (ncards < MAXDEV && fgets(line, sizeof line, f)) {
        struct card *c = &cards[ncards];
        if (sscanf(line, "%d %31s %llu %llu %d %d %d %d %ld %lf %d", &c->index, c->bus, &c->total_mib, &c->used_mib,
                   &c->gen, &c->width, &c->gen_max, &c->width_max, &c->vram_bad, &c->lost_after, &c->hang) == 11)
            ncards++;
    }
    pclose(f);
    return ncards > 0;
}

static CUresult gone(void) {
    struct card *c;
    char cmd[128];
    if (lost)
        return 999;
    if (cur < 0 || first_kernel < 0)
        return 0;
    c = &cards[cur];
    if (c->lost_after > 0 && now() - first_kernel >= c->lost_after) {
        snprintf(cmd, sizeof cmd, "nvidia-smi sim xid 79 -i %d --lost >/dev/null 2>&1", c->index);
        if (system(cmd) != 0)
            fprintf(stderr, "cuda stand-in: %s failed\n", cmd);
        lost = 1;
        return 999;
    }
    return 0;
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    return load_cards() ? 0 : 100;   /* CUDA_ERROR_NO_DEVICE */
}

CUresult cuGetErrorName(CUresult rc, const char **name) {
    *name = rc == 999 ? "CUDA_ERROR_UNKNOWN" : rc == 2 ? "CUDA_ERROR_OUT_OF_MEMORY"
          : rc == 100 ? "CUDA_ERROR_NO_DEVICE" : rc == 101 ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR";
    return 0;
}

/* the card's bus id (nvidia-smi's 00000000:07:00.0) against the one asked for, in the form the
 * real call takes: dddd:bb:dd.f */
static int same_bus(const char *card, const char *asked) {
    size_t lc = strlen(card);
    return strlen(asked) == 12 && lc >= 12 && strcasecmp(card + lc - 12, asked) == 0;
}

CUresult cuDeviceGetByPCIBusId(int *dev, const char *bus) {
    for (int i = 0; i < ncards; i++)
        if (same_bus(cards[i].bus, bus)) {
            *dev = i;
            return 0;
        }
    return 101;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (dev < 0 || dev >= ncards)
        return 101;
    *ctx = (void *)(uintptr_t)(dev + 1);
    return 0;
}

CUresult cuCtxSetCurrent(void *ctx) {
    int dev = (int)(uintptr_t)ctx - 1;
    if (dev < 0 || dev >= ncards)
        return 201;   /* CUDA_ERROR_INVALID_CONTEXT */
    cur = dev;
    return 0;
}

CUresult cuDeviceGetAttribute(int *value, int attr, int dev) {
    (void)dev;
    *value = attr == 16 ? 4 : attr == 75 ? 8 : 0;   /* 4 multiprocessors (a small burn); compute capability 8.x */
    return 0;
}

CUresult cuModuleLoadData(void **module, const void *image) {
    *module = strstr((const char *)image, ".entry burn") ? (void *)1 :
              strstr((const char *)image, ".entry mma_mem") ? (void *)2 : NULL;
    return *module ? 0 : 218;   /* CUDA_ERROR_INVALID_PTX */
}

CUresult cuModuleGetFunction(void **fn, void *module, const char *name) {
    (void)module;
    *fn = !strcmp(name, "fill") ? (void *)1 : !strcmp(name, "check") ? (void *)2 : !strcmp(name, "burn") ? (void *)3 :
          !strcmp(name, "mma_mem") ? (void *)4 : !strcmp(name, "rand") ? (void *)5 : NULL;
    return *fn ? 0 : 500;   /* CUDA_ERROR_NOT_FOUND */
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    size_t total = (size_t)cards[cur].total_mib << 20, used = ((size_t)cards[cur].used_mib << 20) + used_bytes;
    *total_b = total;
    *free_b = used < total ? total - used : 0;
    return gone();
}

static struct alloc *find(CUdeviceptr p) {
    for (int i = 0; i < nallocs; i++)
        if (p >= allocs[i].ptr && p < allocs[i].ptr + allocs[i].size)
            return &allocs[i];
    return NULL;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    size_t free_b, total_b;
    CUresult rc = cuMemGetInfo_v2(&free_b, &total_b);
    if (rc)
        return rc;
    if (size > free_b || nallocs >= MAXALLOC)
        return 2;
    allocs[nallocs] = (struct alloc){next_ptr, size, size <= REAL_MAX ? calloc(1, size) : NULL, 0, 0};
    *ptr = next_ptr;
    next_ptr += (size + 0xFFFFF) & ~0xFFFFFull;
    used_bytes += size;
    nallocs++;
    return 0;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    struct alloc *a = find(ptr);
    if (!a)
        return 1;
    free(a->real);
    used_bytes -= a->size;
    *a = allocs[--nallocs];
    return 0;
}

CUresult cuMemsetD32_v2(CUdeviceptr ptr, unsigned value, size_t n) {
    struct alloc *a = find(ptr);
    if (!a)
        return 1;
    if (a->real)
        for (size_t i = 0; i < n; i++)
            ((unsigned *)a->real)[i] = value;
    return gone();
}

static int is_pinned(const void *p) {
    for (int i = 0; i < 64; i++)
        if (pinned[i] && (const char *)p >= (const char *)pinned[i] && (const char *)p < (const char *)pinned[i] + pinned_size[i])
            return 1;
    return 0;
}

/* A copy over the link ends on the link's schedule, not a sleep of its own: a copy starts when the
 * link is free (the last one's end) or now, whichever is later, less at most half a copy's time a
 * late wake-up of the last one lost (on a loaded 2-core lab machine a 10 ms sleep woke 30 ms late:
 * a healthy x16 link measured 0.21 of itself, below the burn-in's 0.25); a link trained down still
 * measures as one (x1 at most 2x of its 1/16) */
static double link_free;

static void link_time(size_t size) {
    static const double lane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};
    struct card *c = &cards[cur];
    int gen = c->gen > 0 && c->gen < 7 ? c->gen : 1;
    double gbps = lane[gen] * (c->width > 0 ? c->width : 1) * 0.85;
    double s = size / (gbps * 1e9), t = now();
    double end = (link_free > t - s / 2 ? link_free : t - s / 2) + s;
    struct timespec ts = {(time_t)end, (long)((end - (time_t)end) * 1e9)};
    link_free = end;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static CUresult copy(void *dst, const void *src, size_t size, struct alloc *a, int to_device) {
    CUresult rc = gone();
    if (rc)
        return rc;
    if (!a)
        return 1;
    if (is_pinned(to_device ? src : dst)) {
        link_time(size);    /* the measured path: timed as the link */
        if (!a->filled)     /* the PCIe pass's buffer: the bytes not moved */
            return 0;
    }
    if (a->real)
        memcpy(dst, src, size);
    else if (!to_device && a->filled)   /* an accounted allocation: the words its seed stands for */
        for (size_t i = 0; i < size / 4; i++)
            ((unsigned *)dst)[i] = a->seed ^ (unsigned)i * 0x9E3779B1u;
    return 0;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t size) {
    struct alloc *a = find(dst);
    return copy(a && a->real ? (char *)a->real + (dst - a->ptr) : NULL, src, size, a, 1);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t size) {
    struct alloc *a = find(src);
    return copy(dst, a && a->real ? (char *)a->real + (src - a->ptr) : NULL, size, a, 0);
}

CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags) {
    (void)flags;
    for (int i = 0; i < 64; i++)
        if (!pinned[i]) {
            pinned[i] = malloc(size);
            pinned_size[i] = size;
            *p = pinned[i];
            return pinned[i] ? 0 : 2;
        }
    return 2;
}

CUresult cuMemFreeHost(void *p) {
    for (int i = 0; i < 64; i++)
        if (pinned[i] == p) {
            free(p);
            pinned[i] = NULL;
        }
    return 0;
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
    CUresult rc;
    struct alloc *a;
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream; (void)extra; (void)gx; (void)bx;
    if (first_kernel < 0)
        first_kernel = now();
    if ((rc = gone()))
        return rc;
    if (cards[cur].hang)
        for (;;)
            pause();
    if (fn == (void *)1 || fn == (void *)2) {   /* fill / check: (ptr, n, seed[, count]) */
        CUdeviceptr ptr = *(CUdeviceptr *)params[0];
        unsigned seed = *(unsigned *)params[2];
        if (!(a = find(ptr)))
            return 700;
        if (fn == (void *)1) {
            a->seed = seed;
            a->filled = 1;
        } else {
            struct alloc *count = find(*(CUdeviceptr *)params[3]);
            unsigned bad = (!a->filled || a->seed != seed) ? (unsigned)(a->size / 4) : 0;
            if (a == &allocs[0] || a->ptr == allocs[0].ptr)
                bad += (unsigned)cards[cur].vram_bad;    /* the injected bad words, in the first chunk */
            if (count && count->real)
                *(unsigned *)count->real += bad;
        }
        return 0;
    }
    if (fn == (void *)3) {                       /* burn: (out, n, iters) */
        CUdeviceptr ptr = *(CUdeviceptr *)params[0];
        unsigned n = *(unsigned *)params[1], iters = *(unsigned *)params[2];
        if (!(a = find(ptr)) || !a->real)
            return 700;
        for (unsigned i = 0; i < n; i++) {
            unsigned x = i;
            for (unsigned k = 0; k < iters; k++) {
                x = x * 1664525u + 1013904223u;
                x ^= x >> 13;
            }
            ((unsigned *)a->real)[i] = x;
        }
        return gone();
    }
    if (fn == (void *)4) {                       /* mma_mem: (src, out, iters, mask): 4 floats a thread */
        struct alloc *src = find(*(CUdeviceptr *)params[0]);
        unsigned iters = *(unsigned *)params[2], mask = *(unsigned *)params[3], n = gx * bx * 4;
        if (!src || !src->real || !(a = find(*(CUdeviceptr *)params[1])) || !a->real || a->size < (size_t)n * 4)
            return 700;
        for (unsigned i = 0; i < n; i++)
            ((float *)a->real)[i] = (float)(((unsigned *)src->real)[(i * 6) & mask] & 0xFFFF) * (float)iters;
        nanosleep(&(struct timespec){0, 5000000}, NULL);   /* a launch takes 5 ms, on the card's clock too */
        card_clock += 0.005;
        return gone();
    }
    if (fn == (void *)5) {                       /* rand: (ptr, n, seed, mask, bits) */
        unsigned long long n = *(unsigned long long *)params[1];
        unsigned seed = *(unsigned *)params[2], mask = *(unsigned *)params[3], bits = *(unsigned *)params[4];
        if (!(a = find(*(CUdeviceptr *)params[0])) || n * 4 > a->size)
            return 700;
        a->seed = seed;
        a->filled = 1;
        if (a->real)
            for (unsigned long long i = 0; i < n; i++)
                ((unsigned *)a->real)[i] = (fmix((unsigned)i + seed * 0x9E3779B9u) & mask) | bits;
        return gone();
    }
    return 400;   /* CUDA_ERROR_INVALID_HANDLE */
}

CUresult cuCtxSynchronize(void) {
    return gone();
}

/* ---------------------------------------------------------------- for the cuBLAS stand-in */
int lab_card_index(void) {
    return cur >= 0 ? cards[cur].index : -1;
}

/* C = A B, as a digest of the operands' seeds (accounted allocations) or of their first words (real
 * ones); ``wrong``: one bit off */
int lab_gemm(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, double seconds, int wrong) {
    struct alloc *pa = find(a), *pb = find(b), *pc = find(c);
    unsigned sa, sb;
    if (!pa || !pb || !pc || gone())
        return 1;
    card_clock += seconds;
    sa = pa->real ? *(unsigned *)pa->real : pa->seed;
    sb = pb->real ? *(unsigned *)pb->real : pb->seed;
    pc->seed = fmix(sa * 31u + sb) ^ (wrong ? 1u : 0u);
    pc->filled = 1;
    if (pc->real)
        for (size_t i = 0; i < pc->size / 4; i++)
            ((unsigned *)pc->real)[i] = pc->seed ^ (unsigned)i * 0x9E3779B1u;
    return 0;
}

CUresult cuStreamCreate(void **stream, unsigned flags) {
    static uintptr_t next = 0x100;
    (void)flags;
    *stream = (void *)next++;
    return 0;
}

CUresult cuStreamSynchronize(void *stream) {
    (void)stream;
    return gone();
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t size, void *stream) {
    (void)stream;
    if (!find(dst) || !find(src) || size > find(dst)->size)
        return 1;
    return gone();
}
CUresult cuEventCreate(void **event, unsigned flags) {
    (void)flags;
    *event = calloc(1, sizeof(double));
    return *event ? 0 : 2;
}

CUresult cuEventRecord(void *event, void *stream) {
    (void)stream;
    *(double *)event = card_clock;
    return gone();
}

CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    *ms = (float)((*(double *)end - *(double *)start) * 1000);
    return gone();
}
CUresult cuEventQuery(void *event) {
    (void)event;
    return gone();
}

CUresult cuStreamQuery(void *stream) {   /* every call here has finished when it returns */
    (void)stream;
    return gone();
}
#endif
