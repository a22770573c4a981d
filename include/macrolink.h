/*
 * macrolink.h - C interface of the macrolink messaging core.
 *
 * Directed Point calls: a process starts its node with dp_init, opens
 * endpoints (dp_open), makes targets to remote endpoints named by
 * (node id, endpoint id) in one of three modes (dp_target), then writes
 * (dp_write) and reads (dp_read). Put mode writes one-sided into a region
 * the remote endpoint registered (dp_register, dp_put).
 *
 * Every call returns a non-negative value on success and a negative DP_E*
 * code on failure; dp_strerror names it. Link with -lmacrolink_dp
 * (libmacrolink_dp.a or .so) and -lpthread -ldl -lm.
 */
#ifndef MACROLINK_H
#define MACROLINK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Modes (dp_target). */
#define DP_DATAGRAM 0 /* unreliable, at most one MTU (2048 bytes by default) */
#define DP_RELIABLE 1 /* connected, ordered, any size */
#define DP_PUT      2 /* one-sided write into a registered region */

/* Transports (dp_target). */
#define DP_AUTO 0 /* shared memory on the same host, else tcp */
#define DP_SHM  1
#define DP_TCP  2
#define DP_UDP  3 /* datagram mode only */
#define DP_UCX  4 /* UCX: InfiniBand, RoCE, ...; the node needs MACROLINK_UCX=1 */

/* Completion (dp_open). */
#define DP_POLL 0 /* spin: lowest latency */
#define DP_WAIT 1 /* sleep until traffic arrives */

/* Errors (returned negated). */
#define DP_EINVAL    1
#define DP_ENOTINIT  2
#define DP_EBADF     3
#define DP_ETOOLARGE 4
#define DP_ESMALLBUF 5
#define DP_ENOEP     6
#define DP_EUNREACH  7
#define DP_ELOST     8
#define DP_EREFUSED  9
#define DP_ETIMEDOUT 10
#define DP_EINUSE    11
#define DP_EMODE     12
#define DP_EIO       13
#define DP_EPROTO    14

/* What dp_read received. */
struct dp_info {
    uint32_t node;   /* sending node */
    uint32_t ep;     /* sending endpoint */
    uint32_t kind;   /* 0: a message; 1: a put was placed */
    uint32_t mode;   /* DP_DATAGRAM or DP_RELIABLE for messages, DP_PUT for puts */
    uint64_t key;    /* region key of a placed put */
    uint64_t offset; /* region offset of a placed put */
};

/* Node: shm_dir NULL = default meeting directory; tcp_listen NULL = "127.0.0.1:0".
   MACROLINK_UCX=1 in the environment starts UCX as well (for DP_UCX). */
int dp_init(uint32_t node, const char *shm_dir, const char *tcp_listen);
int dp_tcp_port(void);
int dp_add_peer(uint32_t node, const char *tcp_addr);
int dp_finalize(void);

/* Endpoints. dp_open returns a descriptor; dp_target a target number. */
int dp_open(uint32_t dpid, int completion);
int dp_target(int fd, uint32_t nid, uint32_t dpid, int mode, int transport);
ssize_t dp_write(int fd, int target, const void *buf, size_t len);
/* timeout_ms < 0 waits forever; info may be NULL. */
ssize_t dp_read(int fd, void *buf, size_t len, struct dp_info *info, int timeout_ms);
int dp_progress(int fd);
int dp_close(int fd);

/* Put mode. *base stays valid until dp_close. dp_put waits until placed. */
int dp_register(int fd, size_t len, uint64_t *key, void **base);
int dp_put(int fd, int target, const void *buf, size_t len, uint64_t offset, uint64_t key, int notify);

const char *dp_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif /* MACROLINK_H */
