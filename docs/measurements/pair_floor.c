/* What MPI itself costs for a small collective on two ranks, in C: each
 * nonblocking collective (started, then tested until done, as pycoll's default
 * wait mode makes it), its blocking form, and the same bytes as one
 * MPI_Isendrecv (over a duplicate communicator, a tag per call) with
 * MPI_Reduce_local where the collective reduces, as pycoll.collectives.pair
 * makes it. Each case's result is checked once first (float32 SUM of
 * rank + 1); then 9 rounds, each timing a loop of every case in an order
 * rotated by one every round, a case's time the slower rank's mean per call;
 * rank 0 prints each case's median over rounds. A measurement for
 * docs/benchmarks.md, not part of pycoll:
 *
 *   mpicc -O2 -o /tmp/pair_floor docs/measurements/pair_floor.c
 *   mpiexec -n 2 /tmp/pair_floor 2 20000      # floats per rank, calls per loop
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX (1 << 20)
static float x[2 * MAX], tmp[MAX];
static int me, peer, n;
static MPI_Comm world, side;

static void done_(MPI_Request *r) {
    int done = 0;
    while (!done) MPI_Test(r, &done, MPI_STATUS_IGNORE);
}

static void iallreduce(int i) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, world, &r);
    done_(&r);
}
static void allreduce(int i) { MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, world); }
static void pair_allreduce(int i) {
    MPI_Request r;
    MPI_Isendrecv(x, n, MPI_FLOAT, peer, i & 0x7fff, tmp, n, MPI_FLOAT, peer, i & 0x7fff, side, &r);
    done_(&r);
    MPI_Reduce_local(tmp, x, n, MPI_FLOAT, MPI_SUM);
}
static void ireduce(int i) {
    MPI_Request r;
    MPI_Ireduce(me == 0 ? MPI_IN_PLACE : x, x, n, MPI_FLOAT, MPI_SUM, 0, world, &r);
    done_(&r);
}
static void reduce(int i) { MPI_Reduce(me == 0 ? MPI_IN_PLACE : x, x, n, MPI_FLOAT, MPI_SUM, 0, world); }
static void pair_reduce(int i) {
    MPI_Request r;
    MPI_Isendrecv(x, n, MPI_FLOAT, me ? 0 : MPI_PROC_NULL, i & 0x7fff, tmp, n, MPI_FLOAT,
                  me ? MPI_PROC_NULL : 1, i & 0x7fff, side, &r);
    done_(&r);
    if (me == 0) MPI_Reduce_local(tmp, x, n, MPI_FLOAT, MPI_SUM);
}
static void ibcast(int i) {
    MPI_Request r;
    MPI_Ibcast(x, n, MPI_FLOAT, 0, world, &r);
    done_(&r);
}
static void bcast(int i) { MPI_Bcast(x, n, MPI_FLOAT, 0, world); }
static void pair_bcast(int i) {
    MPI_Request r;
    MPI_Isendrecv(x, n, MPI_FLOAT, me ? MPI_PROC_NULL : 1, i & 0x7fff, x, n, MPI_FLOAT,
                  me ? 0 : MPI_PROC_NULL, i & 0x7fff, side, &r);
    done_(&r);
}
static void iallgather(int i) {
    MPI_Request r;
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_FLOAT, x, n, MPI_FLOAT, world, &r);
    done_(&r);
}
static void allgather(int i) { MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, x, n, MPI_FLOAT, world); }
static void pair_allgather(int i) {
    MPI_Request r;
    MPI_Isendrecv(x + me * n, n, MPI_FLOAT, peer, i & 0x7fff, x + peer * n, n, MPI_FLOAT, peer,
                  i & 0x7fff, side, &r);
    done_(&r);
}

typedef void (*call_t)(int);
#define CASES 12
static call_t calls[CASES] = {iallreduce, allreduce, pair_allreduce, ireduce, reduce, pair_reduce,
                              ibcast, bcast, pair_bcast, iallgather, allgather, pair_allgather};
static const char *names[CASES] = {
    "MPI_Iallreduce", "MPI_Allreduce", "Isendrecv+Reduce_local", "MPI_Ireduce", "MPI_Reduce",
    "Isendrecv+Reduce_local", "MPI_Ibcast", "MPI_Bcast", "Isendrecv", "MPI_Iallgather",
    "MPI_Allgather", "Isendrecv"};

/* One call on fresh inputs: 0 where its result is right on this rank. */
static int wrong(int k) {
    int i, bad = 0, gather = k >= 9;
    for (i = 0; i < 2 * n; i++) x[i] = gather ? (float)(i / n + 1) * (i / n == me) : me + 1;
    calls[k](7);
    for (i = 0; i < (gather ? 2 * n : n); i++) {
        float want = k < 3 ? 3 : k < 6 ? (me == 0 ? 3 : me + 1) : k < 9 ? 1 : (float)(i / n + 1);
        bad += x[i] != want;
    }
    return bad;
}

static int cmp(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

int main(int argc, char **argv) {
    long iters, j;
    int k, round, bad = 0;
    double t[CASES][9];
    MPI_Init(&argc, &argv);
    world = MPI_COMM_WORLD;
    MPI_Comm_dup(world, &side);
    MPI_Comm_rank(world, &me);
    peer = 1 - me;
    n = argc > 1 ? atoi(argv[1]) : 2;
    iters = argc > 2 ? atol(argv[2]) : 20000;
    if (n < 1 || n > MAX) MPI_Abort(world, 2);
    for (k = 0; k < CASES; k++) bad += wrong(k);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, world);
    if (bad) {
        if (me == 0) printf("wrong results: %d\n", bad);
        MPI_Abort(world, 1);
    }
    for (round = 0; round < 9; round++)
        for (k = 0; k < CASES; k++) {
            int c = (k + round) % CASES;
            double t0;
            MPI_Barrier(world);
            t0 = MPI_Wtime();
            for (j = 0; j < iters; j++) calls[c]((int)j);
            t[c][round] = (MPI_Wtime() - t0) / iters;
            MPI_Allreduce(MPI_IN_PLACE, &t[c][round], 1, MPI_DOUBLE, MPI_MAX, world);
        }
    if (me == 0) {
        printf("# 2 ranks, %d floats a rank, median of 9 rounds, us per call (results checked)\n", n);
        for (k = 0; k < CASES; k++) {
            qsort(t[k], 9, sizeof(double), cmp);
            printf("%-24s %8.3f\n", names[k], t[k][4] * 1e6);
        }
    }
    MPI_Finalize();
    return 0;
}
