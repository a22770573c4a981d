/*
 * pingpong.c - a round trip through the macrolink C interface.
 *
 *   pingpong server SHM_DIR            node 2, endpoint 5: answers, then exits
 *   pingpong client SHM_DIR PORT       node 1: reliable, datagram and put
 *                                       round trips over shm and tcp
 */
#include <macrolink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                         \
    do {                                                                    \
        long long rc_ = (long long)(call);                                  \
        if (rc_ < 0) {                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,  \
                    dp_strerror((int)rc_));                                 \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

#define BIG (1 << 20)
#define REGION (1 << 20)

static uint32_t sum(const unsigned char *p, size_t n) {
    uint32_t a = 1, b = 0; /* Adler-32 */
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % 65521;
        b = (b + a) % 65521;
    }
    return (b << 16) | a;
}

static int server(const char *dir) {
    CHECK(dp_init(2, dir, "127.0.0.1:0"));
    int fd = dp_open(5, DP_WAIT);
    CHECK(fd);
    uint64_t key;
    void *base;
    CHECK(dp_register(fd, REGION, &key, &base));
    printf("ready %d %llu\n", dp_tcp_port(), (unsigned long long)key);
    fflush(stdout);
    unsigned char *buf = malloc(BIG);
    for (;;) {
        struct dp_info info;
        ssize_t n = dp_read(fd, buf, BIG, &info, 20000);
        CHECK(n);
        int mode = info.kind == 1 ? DP_RELIABLE : (int)info.mode;
        const unsigned char *reply = buf;
        if (info.kind == 1) /* answer a put with the bytes it placed */
            reply = (const unsigned char *)base + info.offset;
        if (info.kind == 0 && n == 3 && memcmp(buf, "bye", 3) == 0)
            break;
        /* answer over the transport it came in on: shm for node 1 here */
        int t = dp_target(fd, info.node, info.ep, mode, DP_AUTO);
        CHECK(t);
        CHECK(dp_write(fd, t, reply, (size_t)n));
    }
    CHECK(dp_close(fd));
    CHECK(dp_finalize());
    free(buf);
    return 0;
}

static int client(const char *dir, const char *port, uint64_t key) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%s", port);
    CHECK(dp_init(1, dir, NULL));
    CHECK(dp_add_peer(2, addr));
    int fd = dp_open(1, DP_WAIT);
    CHECK(fd);
    unsigned char *out = malloc(BIG), *in = malloc(BIG);
    for (int i = 0; i < BIG; i++)
        out[i] = (unsigned char)(i * 131 + 7);
    struct dp_info info;

    int r = dp_target(fd, 2, 5, DP_RELIABLE, DP_SHM);
    CHECK(r);
    CHECK(dp_write(fd, r, out, BIG));
    ssize_t n = dp_read(fd, in, BIG, &info, 20000);
    CHECK(n);
    if (n != BIG || sum(in, BIG) != sum(out, BIG) || info.node != 2 || info.ep != 5) {
        fprintf(stderr, "reliable round trip corrupted\n");
        return 1;
    }

    int d = dp_target(fd, 2, 5, DP_DATAGRAM, DP_SHM);
    CHECK(d);
    if (dp_write(fd, d, out, 4096) != -DP_ETOOLARGE) {
        fprintf(stderr, "oversized datagram not refused\n");
        return 1;
    }
    CHECK(dp_write(fd, d, out, 100));
    n = dp_read(fd, in, BIG, &info, 20000);
    CHECK(n);
    if (n != 100 || memcmp(in, out, 100) != 0 || info.mode != DP_DATAGRAM) {
        fprintf(stderr, "datagram round trip corrupted\n");
        return 1;
    }

    int p = dp_target(fd, 2, 5, DP_PUT, DP_TCP);
    CHECK(p);
    if (dp_put(fd, p, out, 16, 0, key ^ 1, 0) != -DP_EREFUSED) {
        fprintf(stderr, "put with a wrong key not refused\n");
        return 1;
    }
    CHECK(dp_put(fd, p, out, 65536, 4096, key, 1));
    n = dp_read(fd, in, BIG, &info, 20000);
    CHECK(n);
    if (n != 65536 || memcmp(in, out, 65536) != 0) {
        fprintf(stderr, "put round trip corrupted\n");
        return 1;
    }

    CHECK(dp_write(fd, r, "bye", 3));
    CHECK(dp_close(fd));
    CHECK(dp_finalize());
    free(out);
    free(in);
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "server") == 0)
        return server(argv[2]);
    if (argc == 5 && strcmp(argv[1], "client") == 0)
        return client(argv[2], argv[3], strtoull(argv[4], NULL, 10));
    fprintf(stderr, "usage: pingpong server DIR | pingpong client DIR PORT KEY\n");
    return 2;
}
