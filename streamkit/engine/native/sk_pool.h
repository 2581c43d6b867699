/* A small thread pool for the native kernels: persistent workers, spin barriers.
 *
 * Why not OpenMP: libgomp counts the threads of every pool in the process (each Python thread that
 * runs torch ops gets one) and, once they outnumber the CPUs, cuts its barrier spinning to ~100
 * iterations, so every barrier becomes a futex sleep and wake. On 2 cores that doubled the time of a
 * decode step run from the engine's thread (18 ms instead of 9). These workers spin a bounded time
 * at barriers and when idle, then yield or sleep, whatever else the process does.
 *
 * pool_run(job, arg, nt) runs job(arg, team) on nt threads (the caller is thread 0) and returns
 * when all are done. Inside a job, team_barrier(team) orders phases. Jobs from different threads
 * (two engines in one process) run one after the other. */
#ifndef SK_POOL_H
#define SK_POOL_H

#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SK_MAX_THREADS 256 /* ids fit the 16 bits SK_WORKER_ARG gives them */
#define SK_IDLE_SPINS 4000    /* pause iterations (~0.1-0.5 ms) before an idle worker sleeps */
#define SK_BARRIER_SPINS 2000 /* before a waiting thread starts yielding its core */

/* sense: the centralized barrier's; epoch: the flag barrier's count of this job's barriers so far */
typedef struct {
    int tid, nt, sense;
    uint64_t epoch;
} sk_team;

/* Teams up to this size meet at barriers by flags: each thread stores how many barriers it has
 * reached in a line of its own and waits until every other thread's count has reached its own. The
 * last thread's store is then one line transfer from each waiter. The centralized barrier (a shared
 * count, then a shared sense) takes three in a row: the count's line to the last arriver, the sense's
 * line from its readers, back to them. Larger teams take it, not nt line reads a thread. */
#define SK_FLAG_BARRIER_MAX 16
/* bits of a flag count that number a job's barriers (the job's sequence number above them) */
#define SK_EPOCH_BITS 24

typedef void (*sk_job)(void *arg, sk_team *team);

static struct {
    pthread_mutex_t start_lock, run_lock;
    int started; /* workers 1..started are running */
    _Atomic unsigned gen; /* bumped once per job; workers futex-wait on it */
    _Atomic int sleepers;
    _Atomic int pending; /* workers that have not finished the current job */
    /* a line each: the last thread to arrive writes both while the others spin on bar_sense
     * (line_end keeps the fields after them off bar_sense's line) */
    _Alignas(64) _Atomic int bar_count;
    _Alignas(64) _Atomic int bar_sense;
    _Alignas(64) char line_end;
    sk_job job;
    void *arg;
    int nt;
    uint64_t seq; /* jobs run so far: each starts its flag counts above the last job's */
} g_pool = {.start_lock = PTHREAD_MUTEX_INITIALIZER, .run_lock = PTHREAD_MUTEX_INITIALIZER};

static void futex_wait(_Atomic unsigned *addr, unsigned val) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic unsigned *addr) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void spin_or_yield(int *spins, int limit) {
    if (++*spins < limit) _mm_pause();
    else sched_yield();
}

static struct {
    _Alignas(64) _Atomic uint64_t count;
} g_arrived[SK_FLAG_BARRIER_MAX];

static int g_flag_barrier_max = SK_FLAG_BARRIER_MAX; /* tests lower it to run the centralized one */

static void team_barrier(sk_team *t) {
    if (t->nt <= 1) return;
    if (t->nt <= g_flag_barrier_max) {
        const uint64_t e = ++t->epoch;
        atomic_store_explicit(&g_arrived[t->tid].count, e, memory_order_release);
        for (int i = 0; i < t->nt; i++) {
            int spins = 0;
            while (i != t->tid && atomic_load_explicit(&g_arrived[i].count, memory_order_acquire) < e)
                spin_or_yield(&spins, SK_BARRIER_SPINS);
        }
        return;
    }
    t->sense ^= 1;
    if (atomic_fetch_add(&g_pool.bar_count, 1) == t->nt - 1) {
        atomic_store(&g_pool.bar_count, 0);
        atomic_store(&g_pool.bar_sense, t->sense);
    } else {
        int spins = 0;
        while (atomic_load_explicit(&g_pool.bar_sense, memory_order_acquire) != t->sense)
            spin_or_yield(&spins, SK_BARRIER_SPINS);
    }
}

/* a worker's id and the job generation current when it was created (it may first run after the
 * next job has been posted, and must not mistake that job for an old one) */
#define SK_WORKER_ARG(tid, gen) ((void *)(((uintptr_t)(gen) << 16) | (uintptr_t)(tid)))

static void *pool_worker(void *p) {
    const int tid = (int)((uintptr_t)p & 0xFFFF);
    unsigned seen = (unsigned)((uintptr_t)p >> 16);
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&g_pool.gen, memory_order_acquire)) == seen) {
            if (++spins < SK_IDLE_SPINS) {
                _mm_pause();
            } else {
                atomic_fetch_add(&g_pool.sleepers, 1);
                futex_wait(&g_pool.gen, seen); /* returns at once if gen moved on meanwhile */
                atomic_fetch_sub(&g_pool.sleepers, 1);
                spins = 0;
            }
        }
        seen = g;
        if (tid < g_pool.nt) {
            sk_team team = {tid, g_pool.nt, 0, g_pool.seq << SK_EPOCH_BITS};
            g_pool.job(g_pool.arg, &team);
        }
        atomic_fetch_sub_explicit(&g_pool.pending, 1, memory_order_release);
    }
    return NULL;
}

static void pool_after_fork(void) {
    g_pool.started = 0; /* the child has none of the parent's workers */
    atomic_store(&g_pool.sleepers, 0);
}

/* start workers up to thread id nt-1; returns how many threads can run */
static int pool_grow(int nt) {
    static int atfork_done;
    pthread_mutex_lock(&g_pool.start_lock);
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        atfork_done = 1;
    }
    while (g_pool.started < nt - 1) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int ok =
            pthread_create(&th, &attr, pool_worker, SK_WORKER_ARG(g_pool.started + 1, atomic_load(&g_pool.gen))) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        g_pool.started++;
    }
    const int n = g_pool.started + 1;
    pthread_mutex_unlock(&g_pool.start_lock);
    return nt < n ? nt : n;
}

static void pool_run(sk_job job, void *arg, int nt) {
    if (nt > SK_MAX_THREADS) nt = SK_MAX_THREADS;
    if (nt > 1) nt = pool_grow(nt);
    if (nt <= 1) {
        sk_team solo = {0, 1, 0, 0};
        job(arg, &solo);
        return;
    }
    pthread_mutex_lock(&g_pool.run_lock);
    g_pool.job = job;
    g_pool.arg = arg;
    g_pool.nt = nt;
    g_pool.seq++;
    atomic_store(&g_pool.bar_count, 0);
    atomic_store(&g_pool.bar_sense, 0);
    atomic_store(&g_pool.pending, g_pool.started); /* every worker checks in, idle ones at once */
    atomic_fetch_add(&g_pool.gen, 1);
    if (atomic_load(&g_pool.sleepers) > 0) futex_wake_all(&g_pool.gen);
    sk_team team = {0, nt, 0, g_pool.seq << SK_EPOCH_BITS};
    job(arg, &team);
    int spins = 0;
    while (atomic_load_explicit(&g_pool.pending, memory_order_acquire) > 0) spin_or_yield(&spins, SK_BARRIER_SPINS);
    pthread_mutex_unlock(&g_pool.run_lock);
}

/* contiguous share [*a, *b) of n items for this thread */
static inline void team_span(const sk_team *t, int n, int *a, int *b) {
    *a = (int)((long)n * t->tid / t->nt);
    *b = (int)((long)n * (t->tid + 1) / t->nt);
}

/* Items [0, n) of a phase (a matmul's columns or strips) handed out in chunks: each thread works
 * through its team_span share from the front and then takes chunks from the back of the others'.
 * A thread slowed by the host (the hypervisor, the process's Python threads) no longer holds the
 * other at the phase's barrier: with halves fixed in advance the waits at the matmuls' barriers
 * were about 8 % of a step, at batch 1 and at 16 rows, on 2 cores (Intel Xeon, rdtsc per barrier
 * site; docs/engine.md, *Matmul shares taken on demand*). Each share moves through memory in
 * order, so the weight streams stay sequential (one counter for the whole phase interleaved them).
 * A share is lo | hi << 32 in one word: the owner takes from lo by fetch-add, thieves from hi by
 * compare-and-swap, so the two can never take the same item. */
static struct {
    _Alignas(64) _Atomic uint64_t range;
} g_share[SK_MAX_THREADS];
/* a team of one (pool_run's solo path, which takes no lock) keeps its share to its thread */
static _Thread_local _Atomic uint64_t t_solo_share;

static inline _Atomic uint64_t *share_of(const sk_team *t, int tid) {
    return t->nt > 1 ? &g_share[tid].range : &t_solo_share;
}

static inline uint64_t share_word(int lo, int hi) { return (uint64_t)(uint32_t)lo | (uint64_t)(uint32_t)hi << 32; }

/* publish this thread's share of n items; a barrier must follow before any share_next */
static inline void share_begin(const sk_team *t, int n) {
    int a, b;
    team_span(t, n, &a, &b);
    atomic_store_explicit(share_of(t, t->tid), share_word(a, b), memory_order_relaxed);
}

/* the next items [*a, *b) for this thread, at most `chunk` from its own share, else at most `steal`
 * from another's; 0 once none is left anywhere */
static inline int share_next(const sk_team *t, int chunk, int steal, int *a, int *b) {
    _Atomic uint64_t *own = share_of(t, t->tid);
    uint64_t r = atomic_load_explicit(own, memory_order_relaxed);
    if ((uint32_t)r < (uint32_t)(r >> 32)) {
        r = atomic_fetch_add_explicit(own, (uint64_t)chunk, memory_order_relaxed);
        const int lo = (int)(uint32_t)r, hi = (int)(r >> 32);
        if (lo < hi) { /* lo may now pass hi, by less than a chunk: the share reads as empty */
            *a = lo;
            *b = lo + chunk < hi ? lo + chunk : hi;
            return 1;
        }
    }
    for (int i = 1; i < t->nt; i++) {
        _Atomic uint64_t *v = share_of(t, (t->tid + i) % t->nt);
        uint64_t cur = atomic_load_explicit(v, memory_order_relaxed);
        for (;;) {
            const int lo = (int)(uint32_t)cur, hi = (int)(cur >> 32);
            if (lo >= hi) break;
            const int nh = hi - steal > lo ? hi - steal : lo;
            if (atomic_compare_exchange_weak_explicit(v, &cur, share_word(lo, nh), memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *a = nh;
                *b = hi;
                return 1;
            }
        }
    }
    return 0;
}

#endif
