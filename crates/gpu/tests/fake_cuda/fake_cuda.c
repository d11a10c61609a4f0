/*
 * A stand-in for libcuda, used only by mori-gpu's CPU tests (tests/fake_driver.rs builds it as
 * libcuda.so.1 and runs tests/gpu.rs against it). It implements the driver entry points
 * mori-gpu resolves, with:
 *   - one device ("compute capability 9.0") and a primary context that must be retained and
 *     current on the calling thread for every call that needs one (else INVALID_CONTEXT);
 *   - "device memory" in shared host mappings of memfds, so IPC handles (pid + fd, reopened
 *     through /proc) and POSIX FD shareable handles work between processes;
 *   - streams as in-order queues that really block on wait-value and on events;
 *   - strict argument checks (ranges inside allocations, flags, option lists, struct fields),
 *     so a swapped argument or a wrong flag fails here as it would on a GPU;
 *   - FABRIC handles refused with CUDA_ERROR_NOT_PERMITTED (800), as without IMEX;
 *   - pinned host memory (cuMemHostAlloc must be asked for PORTABLE, or PORTABLE | DEVICEMAP;
 *     cuMemFreeHost refuses to free memory queued work still reads or writes); cuMemFree,
 *     cuMemFreeHost and cuCtxSynchronize abort the process while a stream is blocked on a
 *     wait the host has not satisfied (on a GPU they would wait for it); a DEVICEMAP
 *     block is device-addressable at its host address (cuMemHostGetDevicePointer_v2, as with
 *     unified addressing): copies, memsets, stream memory operations and kernels may use it;
 *   - five kernels: mori_test_fill(u32* out, u32 n, u32 base): out[i] = base + 3 * i, and
 *     the copy kernels of kernels/scatter_gather_copy.cu by their ABI (kernels/README.md):
 *     mori_scatter_gather_copy, mori_paged_copy, mori_paged_copy_inline (run table in
 *     the by-value parameter), mori_ordered_copy (its table checked as the kernel does,
 *     the arrival words' check, segments in order, then the flag write) and
 *     mori_ordered_copy_armed (the same, its table read from memory when it runs), and
 *     mori_ordered_copy_resident (a host thread that runs the tables posted to its ring, exits
 *     when idle or stopped, and holds its stream until then; MORI_FAKE_RESIDENT_EXIT_PAUSE_MS
 *     holds it that long in its exit decision), run in stream order on the host: their effect by the
 *     ABI, not the kernels' code (the fences and the last-block arrival run only on a GPU); a range
 *     outside device memory aborts the process (as a GPU would fault), naming it.
 * The structure layouts below restate cuda.h (CUDA 13.0).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

enum {
    OK = 0, INVALID_VALUE = 1, NO_DEVICE_ = 100, INVALID_DEVICE = 101, INVALID_IMAGE = 200, INVALID_CONTEXT = 201,
    INVALID_PTX = 218, INVALID_HANDLE = 400, NOT_FOUND = 500, NOT_READY = 600, ALREADY_ENABLED = 704,
    NOT_PERMITTED = 800, UNKNOWN = 999
};

#define GRAN (2u << 20)
#define PAGE 4096u
#define API __attribute__((visibility("default")))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int ctx_obj, ctx_refs, inited;
static __thread void *cur_ctx;
#define CTX ((void *)&ctx_obj)
#define NEED_CTX do { if (cur_ctx != CTX || ctx_refs <= 0) return INVALID_CONTEXT; } while (0)

/* ---- memory regions ---- */
enum { R_ALLOC = 1, R_IPC = 2, R_VMM = 3 };
struct region { uint64_t base, size; int fd, kind, access; };
#define MAXR 512
static struct region regs[MAXR];

static struct region *find(uint64_t p, uint64_t n) {
    for (int i = 0; i < MAXR; i++) {
        struct region *r = &regs[i];
        if (r->kind && p >= r->base && n <= r->size && p - r->base <= r->size - n) return r;
    }
    return NULL;
}
static struct region *add_region(uint64_t base, uint64_t size, int fd, int kind, int access) {
    for (int i = 0; i < MAXR; i++)
        if (!regs[i].kind) { regs[i] = (struct region){base, size, fd, kind, access}; return &regs[i]; }
    return NULL;
}
/* Pinned host memory: anonymous mappings, tracked so that frees are checked; `mapped` for
 * CU_MEMHOSTALLOC_DEVICEMAP, whose blocks the device reaches at their host address. */
struct host_block { uint64_t base, size; int mapped; };
#define MAXH 256
static struct host_block hosts[MAXH];
static struct host_block *find_host(uint64_t p, uint64_t n) {
    for (int i = 0; i < MAXH; i++) {
        struct host_block *h = &hosts[i];
        if (h->size && p >= h->base && n <= h->size && p - h->base <= h->size - n) return h;
    }
    return NULL;
}
/* Device-addressable: device memory with access, or a mapped pinned host block. */
static int usable(uint64_t p, uint64_t n) {
    if (!n) n = 1;
    struct region *r = find(p, n);
    if (r) return r->access;
    struct host_block *h = find_host(p, n);
    return h && h->mapped;
}
/* mori_paged_copy's by-value parameter (kernels/README.md): 88 bytes. */
struct paged_params {
    uint64_t a_base, a_layer_stride, a_half_stride, a_block_stride;
    uint64_t b_base, b_layer_stride, b_half_stride, b_block_stride;
    uint64_t block_bytes;
    uint32_t layers, halves, n_runs, a_to_b;
};
_Static_assert(sizeof(struct paged_params) == 88, "PagedParams is 88 bytes");
/* A kernel's access outside device memory: a GPU would fault; the test process stops here. */
static void kernel_range(const char *k, const char *what, uint64_t p, uint64_t n) {
    if (n && !usable(p, n)) {
        fprintf(stderr, "fake libcuda: %s: %s %#llx+%llu is not device memory\n", k, what, (unsigned long long)p, (unsigned long long)n);
        abort();
    }
}
static void run_sg(uint64_t descs, uint64_t n) {
    kernel_range("mori_scatter_gather_copy", "descriptor table", descs, n * 24);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t d[3];
        memcpy(d, (void *)(uintptr_t)(descs + 24 * i), sizeof d);
        kernel_range("mori_scatter_gather_copy", "source", d[0], d[2]);
        kernel_range("mori_scatter_gather_copy", "destination", d[1], d[2]);
        if (d[2]) memmove((void *)(uintptr_t)d[1], (void *)(uintptr_t)d[0], d[2]);
    }
}
/* mori_paged_copy_inline's by-value parameter: the params and 320 runs, 3928 bytes. */
#define PAGED_INLINE_RUNS 320
#define PAGED_INLINE_BYTES (88 + 12 * PAGED_INLINE_RUNS)
/* The paged copy of p over the n_runs runs at host address table (12 bytes each). */
static void run_paged(const unsigned char *table, const struct paged_params *p) {
    uint64_t units = (uint64_t)p->layers * p->halves * p->n_runs;
    for (uint64_t u = 0; u < units; u++) {
        uint64_t r = u % p->n_runs, lh = u / p->n_runs, layer = lh / p->halves, half = lh % p->halves;
        uint32_t run[3];
        memcpy(run, table + 12 * r, sizeof run);
        uint64_t a = p->a_base + layer * p->a_layer_stride + half * p->a_half_stride + run[0] * p->a_block_stride;
        uint64_t b = p->b_base + layer * p->b_layer_stride + half * p->b_half_stride + run[1] * p->b_block_stride;
        uint64_t len = (uint64_t)run[2] * p->block_bytes;
        if (run[2] > 1 && (p->a_block_stride != p->block_bytes || p->b_block_stride != p->block_bytes)) {
            fprintf(stderr, "fake libcuda: mori_paged_copy: run %llu of %u blocks on non-contiguous blocks\n", (unsigned long long)r, run[2]);
            abort();
        }
        kernel_range("mori_paged_copy", "side A", a, len);
        kernel_range("mori_paged_copy", "side B", b, len);
        if (p->a_to_b) memmove((void *)(uintptr_t)b, (void *)(uintptr_t)a, len);
        else memmove((void *)(uintptr_t)a, (void *)(uintptr_t)b, len);
    }
}

/* mori_ordered_copy's by-value parameter (kernels/README.md): 232 bytes. */
struct ordered_copy { uint64_t segs[8][3]; uint64_t arrivals, flag; uint32_t n, flag_value, groups; uint8_t first[8]; uint32_t pad; };
_Static_assert(sizeof(struct ordered_copy) == 232, "OrderedCopy is 232 bytes");
/* Groups the kernel takes: 0 or 1 (one group), else 2..n starting at first[], first[0] = 0 and
 * ascending, on a grid of equal runs. */
static int ordered_table_ok(const struct ordered_copy *t, uint64_t grid) {
    uint32_t g = t->groups > 1 ? t->groups : 1;
    if (!t->n || t->n > 8 || g > t->n || grid % g) return 0;
    for (uint32_t i = 0; i < g; i++)
        if ((i == 0 && t->first[0]) || (i > 0 && t->first[i] <= t->first[i - 1]) || t->first[i] >= t->n) return 0;
    return 1;
}
/* The segments in order (which keeps every group's order); the arrival words (one per group,
 * and one for the launch when there are several) must be 0 (as the kernel's last blocks find
 * them) and are left 0; then the flag, when given. */
static uint64_t now_ns(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec; }
/* `stamp`, when not 0: where the resident grid's flag writer stores the clock just before the
 * flag (kernels/README.md); the launched kernels pass 0. */
static void run_ordered_stamped(const struct ordered_copy *t, uint64_t stamp) {
    uint32_t words = t->groups > 1 ? t->groups + 1 : 1;
    kernel_range("mori_ordered_copy", "arrival words", t->arrivals, 4 * words);
    for (uint32_t w = 0; w < words; w++) {
        if (((volatile uint32_t *)(uintptr_t)t->arrivals)[w] != 0) {
            fprintf(stderr, "fake libcuda: mori_ordered_copy: arrival word %u at %#llx is not 0 at launch\n", w, (unsigned long long)t->arrivals);
            abort();
        }
    }
    for (uint32_t i = 0; i < t->n; i++) {
        kernel_range("mori_ordered_copy", "source", t->segs[i][0], t->segs[i][2]);
        kernel_range("mori_ordered_copy", "destination", t->segs[i][1], t->segs[i][2]);
        if (t->segs[i][2]) memmove((void *)(uintptr_t)t->segs[i][1], (void *)(uintptr_t)t->segs[i][0], t->segs[i][2]);
    }
    if (t->flag) {
        kernel_range("mori_ordered_copy", "flag", t->flag, 4);
        if (stamp) *(volatile uint64_t *)(uintptr_t)stamp = now_ns();
        __sync_synchronize();
        *(volatile uint32_t *)(uintptr_t)t->flag = t->flag_value;
    }
}
static void run_ordered(const struct ordered_copy *t) { run_ordered_stamped(t, 0); }

static int new_memfd(uint64_t size) {
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)size) != 0) { close(fd); return -1; }
    return fd;
}

/* ---- streams and events ---- */
enum { OP_COPY, OP_SET, OP_WRITE32, OP_WRITE64, OP_WAIT32, OP_RECORD, OP_WAIT_EVENT, OP_FILL, OP_SG, OP_PAGED, OP_PAGED_INLINE, OP_ORDERED, OP_ORDERED_ARMED, OP_RESIDENT };
struct event { int done, timing; double t; };
struct op { int kind; uint64_t a, b, n; uint32_t v, cond; struct event *ev; void *blob; struct op *next; };
struct resident_run;
/* `res`: the resident grid this stream last started; the stream runs nothing after it until
 * it exited. */
struct stream { struct op *head, *tail; struct stream *next_stream; struct resident_run *res; };
static struct stream *streams;

static double now_ms(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6; }

static int ready(struct op *o) {
    if (o->kind == OP_WAIT32) {
        uint32_t x = *(volatile uint32_t *)(uintptr_t)o->a;
        switch (o->cond) {
        case 0: return (int32_t)(x - o->v) >= 0;
        case 1: return x == o->v;
        case 2: return (x & o->v) != 0;
        default: return ~(x | o->v) != 0;
        }
    }
    if (o->kind == OP_WAIT_EVENT) return o->ev->done;
    return 1;
}
static void run(struct op *o) {
    switch (o->kind) {
    case OP_COPY: memmove((void *)(uintptr_t)o->a, (void *)(uintptr_t)o->b, o->n); break;
    case OP_SET: memset((void *)(uintptr_t)o->a, (int)o->v, o->n); break;
    case OP_WRITE32: *(volatile uint32_t *)(uintptr_t)o->a = o->v; break;
    case OP_WRITE64: *(volatile uint64_t *)(uintptr_t)o->a = o->b; break;
    case OP_RECORD: o->ev->t = now_ms(); o->ev->done = 1; break;
    case OP_FILL: for (uint64_t i = 0; i < o->n; i++) ((uint32_t *)(uintptr_t)o->a)[i] = o->v + 3u * (uint32_t)i; break;
    case OP_SG: run_sg(o->a, o->n); break;
    case OP_PAGED: {
        const struct paged_params *p = o->blob;
        kernel_range("mori_paged_copy", "run table", o->a, (uint64_t)p->n_runs * 12);
        run_paged((const unsigned char *)(uintptr_t)o->a, p);
        break;
    }
    case OP_PAGED_INLINE: run_paged((const unsigned char *)o->blob + 88, o->blob); break;
    case OP_ORDERED: run_ordered(o->blob); break;
    case OP_ORDERED_ARMED: {
        /* The table as the launch finds it when it runs (after the stream's wait); one it does
         * not take (n = 0: let go; a grid that is not a multiple of the groups) copies nothing. */
        struct ordered_copy t;
        kernel_range("mori_ordered_copy_armed", "table", o->a, sizeof t);
        memcpy(&t, (const void *)(uintptr_t)o->a, sizeof t);
        if (ordered_table_ok(&t, o->n)) {
            if (!t.arrivals || t.arrivals % 64 || t.flag % 4) {
                fprintf(stderr, "fake libcuda: mori_ordered_copy_armed: arrival words %#llx or flag %#llx misaligned\n",
                        (unsigned long long)t.arrivals, (unsigned long long)t.flag);
                abort();
            }
            run_ordered(&t);
        }
        break;
    }
    default: break;
    }
    free(o->blob);
    o->blob = NULL;
}
/* mori_ordered_copy_resident's by-value parameter (kernels/README.md): 40 bytes; the grid as a
 * host thread that follows the ABI: it polls the ring, runs each posted table as
 * mori_ordered_copy (under the driver's lock), and exits after idle_ns with nothing posted, or
 * on stop, with the same store-fence-load on the state word as the kernel. */
struct resident_params { uint64_t ring, scratch, idle_ns; uint32_t depth, start, gen, pad; };
_Static_assert(sizeof(struct resident_params) == 40, "ResidentParams is 40 bytes");
struct resident_run { struct resident_params p; uint64_t grid; int running; pthread_t th; };
static void *resident_main(void *arg) {
    struct resident_run *r = arg;
    volatile uint32_t *ring = (volatile uint32_t *)(uintptr_t)r->p.ring;
    uint32_t seq = r->p.start;
    /* Every block marks itself started (all of them: the host has nothing else on the "GPU"). */
    for (uint64_t b = 0; b < r->grid; b++) ring[(256 + 256 * (uint64_t)r->p.depth) / 4 + b] = r->p.gen;
    ring[2] = 1;
    __sync_synchronize();
    double since = now_ms();
    for (;;) {
        if (ring[0] != seq) {
            const uint64_t seen = now_ns();
            seq++;
            __sync_synchronize(); /* the kernel's acquire after it sees a post */
            const uint64_t slot = r->p.ring + 256 + (uint64_t)(seq & (r->p.depth - 1)) * 256;
            struct ordered_copy t;
            memcpy(&t, (const void *)(uintptr_t)slot, sizeof t);
            /* The stamps after the table (kernels/README.md): seen, relayed, flagged. */
            *(volatile uint64_t *)(uintptr_t)(slot + 232) = seen;
            *(volatile uint64_t *)(uintptr_t)(slot + 240) = now_ns();
            pthread_mutex_lock(&mu);
            if (ordered_table_ok(&t, r->grid)) {
                kernel_range("mori_ordered_copy_resident", "arrival words", t.arrivals, 4);
                run_ordered_stamped(&t, slot + 248);
            }
            pthread_mutex_unlock(&mu);
            since = now_ms();
            continue;
        }
        if (ring[1] == 0 && now_ms() - since < (double)r->p.idle_ns / 1e6) { sched_yield(); continue; }
        ring[2] = 2;
        __sync_synchronize();
        /* A grid held between its two steps (preempted, time-sliced): the host's post must wait
         * for its decision, not run the batch elsewhere. Tests ask for it by this variable. */
        const char *pause = getenv("MORI_FAKE_RESIDENT_EXIT_PAUSE_MS");
        if (pause) usleep((useconds_t)atoi(pause) * 1000);
        if (ring[0] == seq) break;
        ring[2] = 1;
        __sync_synchronize();
    }
    ring[3] = seq;
    __sync_synchronize();
    ring[2] = 3;
    __atomic_store_n(&r->running, 0, __ATOMIC_RELEASE);
    return NULL;
}
/* Whether `s` still runs a resident grid (one that exited is joined and let go). */
static int resident_running(struct stream *s) {
    if (!s->res) return 0;
    if (__atomic_load_n(&s->res->running, __ATOMIC_ACQUIRE)) return 1;
    pthread_join(s->res->th, NULL);
    free(s->res);
    s->res = NULL;
    return 0;
}

/* Runs every runnable operation of every stream until nothing moves. */
static void progress(void) {
    for (int moved = 1; moved;) {
        moved = 0;
        for (struct stream *s = streams; s; s = s->next_stream)
            while (s->head && !resident_running(s) && ready(s->head)) {
                struct op *o = s->head;
                if (o->kind == OP_RESIDENT) {
                    s->res = o->blob;
                    o->blob = NULL;
                    __atomic_store_n(&s->res->running, 1, __ATOMIC_RELEASE);
                    if (pthread_create(&s->res->th, NULL, resident_main, s->res)) { fprintf(stderr, "fake libcuda: no thread for the resident grid\n"); abort(); }
                }
                run(o);
                s->head = o->next;
                if (!s->head) s->tail = NULL;
                free(o);
                moved = 1;
            }
    }
}
/* Calls that wait for the whole device (cuCtxSynchronize, cuMemFree, cuMemFreeHost) wait on a
 * GPU for every stream, also for one blocked on a value or an event only the host can give:
 * forever when nothing else gives it. Here such a call aborts, naming itself. */
static void device_wide(const char *call) {
    progress();
    /* A resident grid exits by itself once nothing is posted (its idle wait): waited for, the
     * lock let go meanwhile so that it can run what is posted. */
    for (int i = 0;; i++) {
        int running = 0;
        for (struct stream *s = streams; s; s = s->next_stream) running |= resident_running(s);
        if (!running) break;
        if (i == 10000) {
            fprintf(stderr, "fake libcuda: %s waits for the whole device, but a resident grid has not exited in 10 s (something keeps posting to it)\n", call);
            abort();
        }
        pthread_mutex_unlock(&mu);
        usleep(1000);
        pthread_mutex_lock(&mu);
        progress();
    }
    for (struct stream *s = streams; s; s = s->next_stream)
        if (s->head && !ready(s->head)) {
            fprintf(stderr, "fake libcuda: %s waits for the whole device, but a stream is blocked on a %s the host has not given: a GPU would block here until it is\n",
                    call, s->head->kind == OP_WAIT32 ? "stream wait-value" : "event wait");
            abort();
        }
}
static int live_stream(struct stream *s) {
    for (struct stream *x = streams; x; x = x->next_stream) if (x == s) return 1;
    return 0;
}
/* Queues on `s`, or runs at once on the null stream. */
static CUresult submit(struct stream *s, struct op o) {
    if (!s) { if (!ready(&o)) return UNKNOWN; run(&o); return OK; }
    if (!live_stream(s)) return INVALID_HANDLE;
    struct op *p = malloc(sizeof *p);
    if (!p) return UNKNOWN;
    *p = o;
    p->next = NULL;
    if (s->tail) s->tail->next = p; else s->head = p;
    s->tail = p;
    progress();
    return OK;
}
#define LOCKED(expr) do { pthread_mutex_lock(&mu); CUresult r__ = (expr); pthread_mutex_unlock(&mu); return r__; } while (0)

/* ---- init, devices, contexts ---- */
API CUresult cuInit(unsigned flags) { if (flags) return INVALID_VALUE; inited = 1; return OK; }
API CUresult cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = 13000; return OK; }
API CUresult cuGetErrorName(unsigned code, const char **p) {
    static const struct { unsigned c; const char *n; } t[] = {{0, "CUDA_SUCCESS"}, {1, "CUDA_ERROR_INVALID_VALUE"},
        {201, "CUDA_ERROR_INVALID_CONTEXT"}, {500, "CUDA_ERROR_NOT_FOUND"}, {800, "CUDA_ERROR_NOT_PERMITTED"}};
    for (unsigned i = 0; i < sizeof t / sizeof t[0]; i++) if (t[i].c == code) { *p = t[i].n; return OK; }
    return INVALID_VALUE;
}
API CUresult cuDeviceGetCount(int *n) { if (!inited) return 3; *n = 1; return OK; }
API CUresult cuDeviceGet(CUdevice *d, int ord) { if (!inited) return 3; if (ord != 0) return INVALID_DEVICE; *d = 0; return OK; }
API CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (d != 0 || len <= 0) return INVALID_VALUE;
    snprintf(name, (size_t)len, "mori fake GPU (CPU test double)");
    return OK;
}
API CUresult cuDeviceGetAttribute(int *v, unsigned a, CUdevice d) {
    if (d != 0) return INVALID_DEVICE;
    switch (a) {
    case 75: *v = 9; return OK;                   /* compute capability major */
    case 76: *v = 0; return OK;                   /* minor */
    case 16: *v = 132; return OK;                 /* multiprocessors */
    case 97: *v = 232448; return OK;              /* max shared memory per block (opt-in) */
    case 134: *v = -1; return OK;                 /* host NUMA id: none */
    case 41: case 92: case 102: case 103: case 110: case 116: case 124: case 128: *v = 1; return OK;
    default: return INVALID_VALUE;
    }
}
API CUresult cuDeviceGetPCIBusId(char *b, int len, CUdevice d) {
    if (d != 0 || len < 13) return INVALID_VALUE;
    snprintf(b, (size_t)len, "0000:1B:00.0");
    return OK;
}
API CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { if (d != 0) return INVALID_DEVICE; *b = 80ull << 30; return OK; }
API CUresult cuDevicePrimaryCtxRetain(void **c, CUdevice d) {
    if (d != 0) return INVALID_DEVICE;
    pthread_mutex_lock(&mu); ctx_refs++; pthread_mutex_unlock(&mu);
    *c = CTX;
    return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d != 0) return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = ctx_refs > 0 ? (ctx_refs--, OK) : INVALID_CONTEXT;
    pthread_mutex_unlock(&mu);
    return r;
}
API CUresult cuCtxSetCurrent(void *c) { if (c && c != CTX) return INVALID_CONTEXT; cur_ctx = c; return OK; }
API CUresult cuCtxGetCurrent(void **c) { *c = cur_ctx; return OK; }
API CUresult cuCtxSynchronize(void) { NEED_CTX; LOCKED((device_wide("cuCtxSynchronize"), OK)); }
API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { NEED_CTX; *f = 70ull << 30; *t = 80ull << 30; return OK; }
API CUresult cuDeviceCanAccessPeer(int *v, CUdevice a, CUdevice b) { if (a != 0 || b != 0) return INVALID_DEVICE; *v = 0; return OK; }
API CUresult cuCtxEnablePeerAccess(void *peer, unsigned flags) { NEED_CTX; (void)peer; (void)flags; return INVALID_DEVICE; }

/* ---- allocation and copies ---- */
static CUresult mem_alloc(CUdeviceptr *p, size_t n) {
    if (!n) return INVALID_VALUE;
    uint64_t size = (n + PAGE - 1) / PAGE * PAGE;
    int fd = new_memfd(size);
    if (fd < 0) return 2;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return 2; }
    if (!add_region((uint64_t)(uintptr_t)m, n, fd, R_ALLOC, 1)) { munmap(m, size); close(fd); return 2; }
    *p = (uint64_t)(uintptr_t)m;
    return OK;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { NEED_CTX; LOCKED(mem_alloc(p, n)); }
static CUresult mem_free(CUdeviceptr p) {
    struct region *r = find(p, 1);
    if (!r || r->kind != R_ALLOC || r->base != p) return INVALID_VALUE;
    device_wide("cuMemFree");
    /* Looked up again: device_wide lets the lock go while a resident grid runs. */
    r = find(p, 1);
    if (!r || r->kind != R_ALLOC || r->base != p) return INVALID_VALUE;
    munmap((void *)(uintptr_t)p, (r->size + PAGE - 1) / PAGE * PAGE);
    close(r->fd);
    r->kind = 0;
    return OK;
}
API CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CTX; LOCKED(mem_free(p)); }
static CUresult range(CUdeviceptr *b, size_t *s, CUdeviceptr p) {
    struct region *r = find(p, 1);
    if (!r) return NOT_FOUND;
    if (b) *b = r->base;
    if (s) *s = r->size;
    return OK;
}
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *b, size_t *s, CUdeviceptr p) { NEED_CTX; LOCKED(range(b, s, p)); }

static CUresult host_alloc(void **pp, size_t n, unsigned flags) {
    /* mori-gpu asks for CU_MEMHOSTALLOC_PORTABLE (1), or PORTABLE | DEVICEMAP (3) */
    if (!pp || !n || (flags != 1 && flags != 3)) return INVALID_VALUE;
    for (int i = 0; i < MAXH; i++)
        if (!hosts[i].size) {
            void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) return 2;
            hosts[i] = (struct host_block){(uint64_t)(uintptr_t)m, n, flags == 3};
            *pp = m;
            return OK;
        }
    return 2;
}
static int overlaps(uint64_t p, uint64_t n, uint64_t base, uint64_t size) { return n && p < base + size && base < p + n; }
/* Whether queued operation o reads or writes base..base+size (kernels' tables not followed). */
static int op_touches(const struct op *o, uint64_t base, uint64_t size) {
    switch (o->kind) {
    case OP_COPY: return overlaps(o->a, o->n, base, size) || overlaps(o->b, o->n, base, size);
    case OP_SET: return overlaps(o->a, o->n, base, size);
    case OP_WRITE32: case OP_WAIT32: return overlaps(o->a, 4, base, size);
    case OP_WRITE64: return overlaps(o->a, 8, base, size);
    case OP_FILL: return overlaps(o->a, o->n * 4, base, size);
    case OP_SG: return overlaps(o->a, o->n * 24, base, size);
    default: return 0;
    }
}
static CUresult host_free(void *p) {
    device_wide("cuMemFreeHost");
    for (int i = 0; i < MAXH; i++)
        if (hosts[i].size && hosts[i].base == (uint64_t)(uintptr_t)p) {
            for (struct stream *s = streams; s; s = s->next_stream)
                for (struct op *o = s->head; o; o = o->next)
                    if (op_touches(o, hosts[i].base, hosts[i].size)) return INVALID_VALUE; /* queued work still uses it */
            munmap(p, hosts[i].size);
            hosts[i].size = 0;
            return OK;
        }
    return INVALID_VALUE;
}
/* Any byte of a mapped block: its device address is its host address (unified addressing). */
static CUresult host_device_ptr(CUdeviceptr *d, void *p, unsigned flags) {
    if (!d || flags) return INVALID_VALUE;
    struct host_block *h = find_host((uint64_t)(uintptr_t)p, 1);
    if (!h || !h->mapped) return INVALID_VALUE;
    *d = (uint64_t)(uintptr_t)p;
    return OK;
}
API CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) { NEED_CTX; LOCKED(host_alloc(pp, n, flags)); }
API CUresult cuMemFreeHost(void *p) { NEED_CTX; LOCKED(host_free(p)); }
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) { NEED_CTX; LOCKED(host_device_ptr(d, p, flags)); }

static CUresult copy(uint64_t dst, int dst_dev, uint64_t src, int src_dev, size_t n, void *s) {
    if ((dst_dev && !usable(dst, n)) || (src_dev && !usable(src, n))) return INVALID_VALUE;
    return submit(s, (struct op){.kind = OP_COPY, .a = dst, .b = src, .n = n});
}
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { NEED_CTX; LOCKED(copy(d, 1, (uintptr_t)h, 0, n, NULL)); }
API CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { NEED_CTX; LOCKED(copy((uintptr_t)h, 0, d, 1, n, NULL)); }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { NEED_CTX; LOCKED(copy(d, 1, s, 1, n, NULL)); }
API CUresult cuMemcpyPeer(CUdeviceptr d, void *dc, CUdeviceptr s, void *sc, size_t n) {
    NEED_CTX; if (dc != CTX || sc != CTX) return INVALID_CONTEXT; LOCKED(copy(d, 1, s, 1, n, NULL));
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) { NEED_CTX; LOCKED(copy(d, 1, (uintptr_t)h, 0, n, s)); }
API CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) { NEED_CTX; LOCKED(copy((uintptr_t)h, 0, d, 1, n, s)); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, void *s) { NEED_CTX; LOCKED(copy(d, 1, src, 1, n, s)); }
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dc, CUdeviceptr src, void *sc, size_t n, void *s) {
    NEED_CTX; if (dc != CTX || sc != CTX) return INVALID_CONTEXT; LOCKED(copy(d, 1, src, 1, n, s));
}
static CUresult set(CUdeviceptr d, unsigned char v, size_t n, void *s) {
    if (!usable(d, n)) return INVALID_VALUE;
    return submit(s, (struct op){.kind = OP_SET, .a = d, .v = v, .n = n});
}
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { NEED_CTX; LOCKED(set(d, v, n, NULL)); }
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *s) { NEED_CTX; LOCKED(set(d, v, n, s)); }

/* ---- streams, events, stream memory operations ---- */
static CUresult stream_create(void **out, unsigned flags) {
    if (flags != 1) return INVALID_VALUE; /* mori-gpu makes non-blocking streams */
    struct stream *s = calloc(1, sizeof *s);
    if (!s) return 2;
    s->next_stream = streams;
    streams = s;
    *out = s;
    return OK;
}
API CUresult cuStreamCreate(void **s, unsigned flags) { NEED_CTX; LOCKED(stream_create(s, flags)); }
static CUresult stream_destroy(struct stream *s) {
    if (!live_stream(s)) return INVALID_HANDLE;
    progress();
    if (s->head || resident_running(s)) return UNKNOWN; /* destroyed while blocked: a test bug */
    for (struct stream **p = &streams; *p; p = &(*p)->next_stream) if (*p == s) { *p = s->next_stream; break; }
    free(s);
    return OK;
}
API CUresult cuStreamDestroy_v2(void *s) { NEED_CTX; LOCKED(stream_destroy(s)); }
static CUresult stream_query(struct stream *s) {
    if (s && !live_stream(s)) return INVALID_HANDLE;
    progress();
    return s && (s->head || resident_running(s)) ? NOT_READY : OK;
}
API CUresult cuStreamQuery(void *s) { NEED_CTX; LOCKED(stream_query(s)); }
API CUresult cuStreamSynchronize(void *s) {
    NEED_CTX;
    for (int i = 0; i < 10000; i++) {
        pthread_mutex_lock(&mu);
        CUresult r = stream_query(s);
        pthread_mutex_unlock(&mu);
        if (r != NOT_READY) return r;
        usleep(1000);
    }
    return UNKNOWN;
}
API CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    NEED_CTX; if (flags || !e) return INVALID_VALUE;
    LOCKED(submit(s, (struct op){.kind = OP_WAIT_EVENT, .ev = e}));
}
API CUresult cuStreamWriteValue32_v2(void *s, CUdeviceptr a, uint32_t v, unsigned flags) {
    NEED_CTX; if (flags || a % 4) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = usable(a, 4) ? submit(s, (struct op){.kind = OP_WRITE32, .a = a, .v = v}) : INVALID_VALUE;
    pthread_mutex_unlock(&mu);
    return r;
}
/* CUstreamBatchMemOpParams (CUDA 13.0): 48 bytes; a write is {u32 operation, pad, u64 address,
 * u64 value (u32 in its low half for 32-bit writes), u32 flags, pad, u64 alias, pad}. Only
 * writes are taken (2: 32-bit, 5: 64-bit), queued in the array's order; the whole batch is
 * checked before any of it is queued. */
API CUresult cuStreamBatchMemOp_v2(void *s, unsigned count, void *params, unsigned flags) {
    NEED_CTX; if (flags || !count || count >= 256 || !params) return INVALID_VALUE;
    const uint64_t *w = params;
    pthread_mutex_lock(&mu);
    CUresult r = OK;
    for (unsigned i = 0; i < count && r == OK; i++) {
        const uint64_t *p = w + 6 * i;
        uint32_t kind = (uint32_t)p[0], size = kind == 2 ? 4 : kind == 5 ? 8 : 0;
        if (!size || (uint32_t)p[3] || p[1] % size || !usable(p[1], size)) r = INVALID_VALUE;
    }
    for (unsigned i = 0; i < count && r == OK; i++) {
        const uint64_t *p = w + 6 * i;
        r = (uint32_t)p[0] == 2 ? submit(s, (struct op){.kind = OP_WRITE32, .a = p[1], .v = (uint32_t)p[2]})
                                : submit(s, (struct op){.kind = OP_WRITE64, .a = p[1], .b = p[2]});
    }
    pthread_mutex_unlock(&mu);
    return r;
}
API CUresult cuStreamWaitValue32_v2(void *s, CUdeviceptr a, uint32_t v, unsigned flags) {
    NEED_CTX; if (flags > 3 || a % 4) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = usable(a, 4) ? submit(s, (struct op){.kind = OP_WAIT32, .a = a, .v = v, .cond = flags}) : INVALID_VALUE;
    pthread_mutex_unlock(&mu);
    return r;
}
API CUresult cuEventCreate(void **e, unsigned flags) {
    NEED_CTX; if (flags != 0 && flags != 2) return INVALID_VALUE;
    struct event *ev = calloc(1, sizeof *ev);
    if (!ev) return 2;
    ev->done = 1;
    ev->timing = flags == 0;
    *e = ev;
    return OK;
}
API CUresult cuEventDestroy_v2(void *e) { NEED_CTX; if (!e) return INVALID_HANDLE; LOCKED((progress(), OK)); }
API CUresult cuEventRecord(void *e, void *s) {
    NEED_CTX; if (!e) return INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    ((struct event *)e)->done = 0;
    CUresult r = submit(s, (struct op){.kind = OP_RECORD, .ev = e});
    pthread_mutex_unlock(&mu);
    return r;
}
API CUresult cuEventQuery(void *e) { NEED_CTX; LOCKED((progress(), ((struct event *)e)->done ? OK : NOT_READY)); }
API CUresult cuEventSynchronize(void *e) {
    NEED_CTX;
    for (int i = 0; i < 10000; i++) {
        if (cuEventQuery(e) == OK) return OK;
        usleep(1000);
    }
    return UNKNOWN;
}
API CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
    NEED_CTX;
    struct event *x = a, *y = b;
    if (!x->timing || !y->timing) return INVALID_HANDLE;
    if (!x->done || !y->done) return NOT_READY;
    *ms = (float)(y->t - x->t);
    return OK;
}

/* ---- IPC: the handle names the exporter's pid and memfd ---- */
struct ipc { char magic[8]; int32_t pid, fd; uint64_t size; };
API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    NEED_CTX;
    pthread_mutex_lock(&mu);
    struct region *r = find(p, 1);
    CUresult res = INVALID_VALUE;
    if (r && r->kind == R_ALLOC && r->base == p) {
        struct ipc i = {"FAKEIPC", getpid(), r->fd, r->size};
        memset(h, 0, sizeof *h);
        memcpy(h, &i, sizeof i);
        res = OK;
    }
    pthread_mutex_unlock(&mu);
    return res;
}
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
    NEED_CTX;
    struct ipc i;
    memcpy(&i, &h, sizeof i);
    if (flags != 1 || memcmp(i.magic, "FAKEIPC", 8) != 0) return INVALID_VALUE;
    if (i.pid == getpid()) return INVALID_CONTEXT; /* as CUDA: not in the exporting process */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", i.pid, i.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return INVALID_HANDLE;
    uint64_t size = (i.size + PAGE - 1) / PAGE * PAGE;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 205;
    pthread_mutex_lock(&mu);
    add_region((uint64_t)(uintptr_t)m, i.size, -1, R_IPC, 1);
    pthread_mutex_unlock(&mu);
    *p = (uint64_t)(uintptr_t)m;
    return OK;
}
API CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    NEED_CTX;
    pthread_mutex_lock(&mu);
    struct region *r = find(p, 1);
    CUresult res = INVALID_VALUE;
    if (r && r->kind == R_IPC && r->base == p) {
        progress();
        munmap((void *)(uintptr_t)p, (r->size + PAGE - 1) / PAGE * PAGE);
        r->kind = 0;
        res = OK;
    }
    pthread_mutex_unlock(&mu);
    return res;
}

/* ---- VMM ---- */
struct vmm { int fd; uint64_t size; int types; };
struct reservation { uint64_t base, size; };
static struct reservation resv[64];

static int prop_ok(const CUmemAllocationProp *p) {
    return p && p->type == 1 && p->location.type == 1 && p->location.id == 0 && !p->win32HandleMetaData &&
           (p->requestedHandleTypes & ~9) == 0;
}
API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, unsigned opt) {
    NEED_CTX; if (!prop_ok(p) || opt != 0) return INVALID_VALUE;
    *g = GRAN;
    return OK;
}
API CUresult cuMemCreate(unsigned long long *h, size_t size, const CUmemAllocationProp *p, unsigned long long flags) {
    NEED_CTX;
    if (!prop_ok(p) || flags || !size || size % GRAN) return INVALID_VALUE;
    if (p->requestedHandleTypes & 8) return NOT_PERMITTED; /* FABRIC without an IMEX channel */
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) return 2;
    v->fd = new_memfd(size);
    if (v->fd < 0) { free(v); return 2; }
    v->size = size;
    v->types = p->requestedHandleTypes;
    *h = (uint64_t)(uintptr_t)v;
    return OK;
}
API CUresult cuMemRelease(unsigned long long h) {
    NEED_CTX; struct vmm *v = (struct vmm *)(uintptr_t)h;
    if (!v) return INVALID_VALUE;
    close(v->fd);
    free(v);
    return OK;
}
API CUresult cuMemAddressReserve(CUdeviceptr *out, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    NEED_CTX;
    if (addr || flags || !size || size % GRAN || (align && align % GRAN)) return INVALID_VALUE;
    size_t a = align ? align : GRAN;
    uint8_t *m = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return 2;
    uintptr_t base = ((uintptr_t)m + a - 1) / a * a;
    if (base > (uintptr_t)m) munmap(m, base - (uintptr_t)m);
    if ((uintptr_t)m + size + a > base + size) munmap((void *)(base + size), (uintptr_t)m + size + a - (base + size));
    pthread_mutex_lock(&mu);
    for (int i = 0; i < 64; i++) if (!resv[i].size) { resv[i] = (struct reservation){base, size}; break; }
    pthread_mutex_unlock(&mu);
    *out = base;
    return OK;
}
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    NEED_CTX;
    CUresult r = INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < 64; i++)
        if (resv[i].base == p && resv[i].size == size && !find(p, 1)) { munmap((void *)(uintptr_t)p, size); resv[i].size = 0; r = OK; }
    pthread_mutex_unlock(&mu);
    return r;
}
static int reserved(uint64_t p, uint64_t n) {
    for (int i = 0; i < 64; i++) if (resv[i].size && p >= resv[i].base && p + n <= resv[i].base + resv[i].size) return 1;
    return 0;
}
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, unsigned long long h, unsigned long long flags) {
    NEED_CTX;
    struct vmm *v = (struct vmm *)(uintptr_t)h;
    if (!v || off || flags || size != v->size) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = INVALID_VALUE;
    if (reserved(p, size) && !find(p, 1) &&
        mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, 0) != MAP_FAILED) {
        add_region(p, size, -1, R_VMM, 0);
        r = OK;
    }
    pthread_mutex_unlock(&mu);
    return r;
}
API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t count) {
    NEED_CTX;
    if (count != 1 || d->location.type != 1 || d->location.id != 0 || d->flags != 3) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct region *r = find(p, size);
    CUresult res = INVALID_VALUE;
    if (r && r->kind == R_VMM && r->base == p && r->size == size && mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) == 0) {
        r->access = 1;
        res = OK;
    }
    pthread_mutex_unlock(&mu);
    return res;
}
API CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    NEED_CTX;
    pthread_mutex_lock(&mu);
    struct region *r = find(p, size);
    CUresult res = INVALID_VALUE;
    if (r && r->kind == R_VMM && r->base == p && r->size == size) {
        progress();
        mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        r->kind = 0;
        res = OK;
    }
    pthread_mutex_unlock(&mu);
    return res;
}
API CUresult cuMemExportToShareableHandle(void *out, unsigned long long h, unsigned type, unsigned long long flags) {
    NEED_CTX;
    struct vmm *v = (struct vmm *)(uintptr_t)h;
    if (!v || flags || !out) return INVALID_VALUE;
    if (type == 8) return NOT_PERMITTED;
    if (type != 1 || !(v->types & 1)) return INVALID_VALUE;
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return UNKNOWN;
    *(int *)out = fd;
    return OK;
}
API CUresult cuMemImportFromShareableHandle(unsigned long long *h, void *os, unsigned type) {
    NEED_CTX;
    if (type == 8) return NOT_PERMITTED;
    if (type != 1) return INVALID_VALUE;
    int fd = (int)(intptr_t)os;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) return INVALID_HANDLE;
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) return 2;
    v->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    v->size = (uint64_t)st.st_size;
    *h = (uint64_t)(uintptr_t)v;
    return OK;
}

/* ---- dmabuf: a new memfd of the window's length stands for the dmabuf ---- */
API CUresult cuMemGetHandleForAddressRange(void *out, CUdeviceptr p, size_t size, unsigned type, unsigned long long flags) {
    NEED_CTX;
    if (type != 1 || flags || !out || !size || p % PAGE || size % PAGE) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct region *r = find(p, size);
    pthread_mutex_unlock(&mu);
    if (!r) return INVALID_VALUE;
    int fd = new_memfd(size);
    if (fd < 0) return UNKNOWN;
    *(int *)out = fd;
    return OK;
}

/* ---- modules and the one kernel ---- */
struct module { char *image; size_t len; int elf; };
struct function { struct module *m; char name[64]; };

API CUresult cuModuleLoadDataEx(void **out, const void *img, unsigned n, unsigned *opts, void **vals) {
    NEED_CTX;
    if (n != 2 || opts[0] != 5 || opts[1] != 6 || !vals[0] || !(uintptr_t)vals[1]) return INVALID_VALUE;
    char *log = vals[0];
    size_t log_len = (size_t)(uintptr_t)vals[1];
    const unsigned char *b = img;
    struct module *m = calloc(1, sizeof *m);
    if (!m) return 2;
    if (!memcmp(b, "\x7f" "ELF", 4)) {
        uint64_t shoff; uint16_t shentsize, shnum;
        memcpy(&shoff, b + 0x28, 8); memcpy(&shentsize, b + 0x3A, 2); memcpy(&shnum, b + 0x3C, 2);
        m->len = shoff + (uint64_t)shentsize * shnum;
        m->elf = 1;
    } else {
        m->len = strlen((const char *)b) + 1;
        if (strstr((const char *)b, "bogus")) {
            snprintf(log, log_len, "fake ptxas: line 6: unknown instruction 'bogus.instruction'");
            free(m);
            return INVALID_PTX;
        }
        if (!strstr((const char *)b, ".entry")) { free(m); return INVALID_PTX; }
    }
    m->image = malloc(m->len);
    if (!m->image) { free(m); return 2; }
    memcpy(m->image, b, m->len);
    *out = m;
    return OK;
}
API CUresult cuModuleUnload(void *m) { NEED_CTX; struct module *x = m; if (!x) return INVALID_HANDLE; free(x->image); free(x); return OK; }
API CUresult cuModuleGetFunction(void **f, void *mod, const char *name) {
    NEED_CTX;
    struct module *m = mod;
    size_t nl = strlen(name);
    if (!m || nl == 0 || nl >= 64) return INVALID_VALUE;
    int found = 0;
    if (m->elf) {
        found = memmem(m->image, m->len, name, nl + 1) != NULL;
    } else {
        for (const char *p = strstr(m->image, ".entry "); p && !found; p = strstr(p + 1, ".entry ")) {
            const char *q = p + 7;
            while (*q == ' ') q++;
            found = !strncmp(q, name, nl) && (q[nl] == '(' || q[nl] == ' ' || q[nl] == '\n');
        }
    }
    if (!found) return NOT_FOUND;
    struct function *fn = calloc(1, sizeof *fn);
    if (!fn) return 2;
    fn->m = m;
    memcpy(fn->name, name, nl);
    *f = fn;
    return OK;
}
API CUresult cuFuncSetAttribute(void *f, unsigned attr, int v) {
    NEED_CTX;
    if (!f) return INVALID_VALUE;
    /* 8: the most dynamic shared memory; 9: the preferred shared-memory split (percent). */
    if (attr == 9) return v >= -1 && v <= 100 ? OK : INVALID_VALUE;
    if (attr != 8 || v < 0 || v > 232448) return INVALID_VALUE;
    return OK;
}
API CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned smem, void *s, void **params, void **extra) {
    NEED_CTX;
    struct function *fn = f;
    if (!fn || !gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 || smem > 232448 || !params || extra)
        return INVALID_VALUE;
    if (!strcmp(fn->name, "mori_scatter_gather_copy")) {
        uint64_t descs; uint32_t n;
        memcpy(&descs, params[0], 8); memcpy(&n, params[1], 4);
        LOCKED(submit(s, (struct op){.kind = OP_SG, .a = descs, .n = n}));
    }
    if (!strcmp(fn->name, "mori_paged_copy")) {
        struct paged_params *p = malloc(sizeof *p);
        if (!p) return 2;
        uint64_t runs;
        memcpy(&runs, params[0], 8); memcpy(p, params[1], sizeof *p);
        if (!p->layers || !p->halves || !p->n_runs || !p->block_bytes || p->a_to_b > 1) { free(p); return INVALID_VALUE; }
        pthread_mutex_lock(&mu);
        CUresult r = submit(s, (struct op){.kind = OP_PAGED, .a = runs, .blob = p});
        pthread_mutex_unlock(&mu);
        if (r != OK) free(p);
        return r;
    }
    if (!strcmp(fn->name, "mori_paged_copy_inline")) {
        unsigned char *t = malloc(PAGED_INLINE_BYTES);
        if (!t) return 2;
        memcpy(t, params[0], PAGED_INLINE_BYTES);
        const struct paged_params *p = (const struct paged_params *)t;
        /* The kernel copies nothing for n_runs > 320; no caller of ours should pass one. */
        if (!p->layers || !p->halves || !p->n_runs || p->n_runs > PAGED_INLINE_RUNS || !p->block_bytes || p->a_to_b > 1) {
            free(t);
            return INVALID_VALUE;
        }
        pthread_mutex_lock(&mu);
        CUresult r = submit(s, (struct op){.kind = OP_PAGED_INLINE, .blob = t});
        pthread_mutex_unlock(&mu);
        if (r != OK) free(t);
        return r;
    }
    if (!strcmp(fn->name, "mori_ordered_copy")) {
        struct ordered_copy *t = malloc(sizeof *t);
        if (!t) return 2;
        memcpy(t, params[0], sizeof *t);
        /* The kernel copies nothing for a table it does not take; no caller of ours should pass one. */
        if (!ordered_table_ok(t, gx) || !t->arrivals || t->arrivals % 64 || t->flag % 4) { free(t); return INVALID_VALUE; }
        pthread_mutex_lock(&mu);
        CUresult r = submit(s, (struct op){.kind = OP_ORDERED, .blob = t});
        pthread_mutex_unlock(&mu);
        if (r != OK) free(t);
        return r;
    }
    if (!strcmp(fn->name, "mori_ordered_copy_armed")) {
        uint64_t table;
        memcpy(&table, params[0], 8);
        if (!table || table % 4) return INVALID_VALUE;
        LOCKED(submit(s, (struct op){.kind = OP_ORDERED_ARMED, .a = table, .n = gx}));
    }
    if (!strcmp(fn->name, "mori_ordered_copy_resident")) {
        struct resident_run *r = calloc(1, sizeof *r);
        if (!r) return 2;
        memcpy(&r->p, params[0], sizeof r->p);
        r->grid = gx;
        const struct resident_params *p = &r->p;
        /* The kernel exits at once on a depth it does not take; no caller of ours should pass one. */
        if (!p->ring || p->ring % 4 || !p->scratch || !p->depth || p->depth > 64 || (p->depth & (p->depth - 1))) { free(r); return INVALID_VALUE; }
        pthread_mutex_lock(&mu);
        CUresult res = usable(p->ring, 256 + 256 * (uint64_t)p->depth + 4 * (uint64_t)gx) && usable(p->scratch, 256 + 256 * (uint64_t)p->depth)
                           ? submit(s, (struct op){.kind = OP_RESIDENT, .blob = r})
                           : INVALID_VALUE;
        pthread_mutex_unlock(&mu);
        if (res != OK) free(r);
        return res;
    }
    if (strcmp(fn->name, "mori_test_fill")) return 98;
    uint64_t out; uint32_t n, base;
    memcpy(&out, params[0], 8); memcpy(&n, params[1], 4); memcpy(&base, params[2], 4);
    uint64_t threads = (uint64_t)gx * gy * gz * bx * by * bz;
    uint64_t count = n < threads ? n : threads;
    pthread_mutex_lock(&mu);
    CUresult r = usable(out, count * 4) ? submit(s, (struct op){.kind = OP_FILL, .a = out, .v = base, .n = count}) : 700;
    pthread_mutex_unlock(&mu);
    return r;
}
