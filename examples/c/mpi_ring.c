/*
 * mpi_ring.c - an MPI program that moves its data with macrolink.
 *
 *   mpicc mpi_ring.c $(pkg-config --cflags --libs macrolink) -o mpi_ring
 *   srun --mpi=pmix -n 4 ./mpi_ring SHM_DIR      (or mpirun -np 4 ./mpi_ring SHM_DIR)
 *
 * MPI starts the ranks and tells each where the others listen; macrolink
 * carries the data. Each rank is macrolink node rank+1 with endpoint 1,
 * sends 1 MiB (reliable mode) to the next rank of the ring and checks what
 * the previous one sent. Ranks on one host meet in SHM_DIR and talk over
 * shared memory; tcp addresses are exchanged for loopback, so this example
 * keeps all ranks on one host.
 */
#include <macrolink.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define SIZE (1 << 20)

#define CHECK(call)                                                         \
    do {                                                                    \
        long long rc_ = (long long)(call);                                  \
        if (rc_ < 0) {                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,  \
                    dp_strerror((int)rc_));                                 \
            MPI_Abort(MPI_COMM_WORLD, 1);                                   \
        }                                                                   \
    } while (0)

static void fill(unsigned char *p, int seed) {
    for (int i = 0; i < SIZE; i++)
        p[i] = (unsigned char)(i * 131 + seed * 17 + 7);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_ring SHM_DIR (2 ranks or more)\n");
        MPI_Finalize();
        return 2;
    }

    CHECK(dp_init((uint32_t)rank + 1, argv[1], "127.0.0.1:0"));
    int port = dp_tcp_port();
    CHECK(port);
    int *ports = malloc(sizeof(int) * (size_t)size);
    MPI_Allgather(&port, 1, MPI_INT, ports, 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) {
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", ports[r]);
        if (r != rank)
            CHECK(dp_add_peer((uint32_t)r + 1, addr));
    }
    int fd = dp_open(1, DP_WAIT);
    CHECK(fd);
    /* Every endpoint is open before anyone writes to it. */
    MPI_Barrier(MPI_COMM_WORLD);

    unsigned char *out = malloc(SIZE), *in = malloc(SIZE), *want = malloc(SIZE);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    fill(out, rank);
    fill(want, prev);
    int t = dp_target(fd, (uint32_t)next + 1, 1, DP_RELIABLE, DP_AUTO);
    CHECK(t);
    CHECK(dp_write(fd, t, out, SIZE));
    struct dp_info info;
    ssize_t n = dp_read(fd, in, SIZE, &info, 20000);
    CHECK(n);
    int ok = n == SIZE && info.node == (uint32_t)prev + 1;
    for (int i = 0; ok && i < SIZE; i++)
        ok = in[i] == want[i];
    /* Nobody closes while a neighbour may still be reading. */
    MPI_Barrier(MPI_COMM_WORLD);

    int all = 0;
    MPI_Reduce(&ok, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("ring of %d ranks: %d of %d received and checked 1 MiB\n", size, all, size);
    CHECK(dp_close(fd));
    CHECK(dp_finalize());
    free(out);
    free(in);
    free(want);
    free(ports);
    MPI_Finalize();
    return all == size || rank != 0 ? 0 : 1;
}
