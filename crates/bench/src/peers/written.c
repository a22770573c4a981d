/*
 * Preloaded into ucx_perftest (LD_PRELOAD): writes each buffer it maps
 * with ucp_mem_map once, before its run, as an application's data would
 * be. ucx_perftest never writes the buffer it sends from, so its pages are
 * the kernel's zero page, and a copy out of them (a cross-memory read, a
 * socket's copy) reads one 4 KiB page over and over, about twice as fast
 * as out of memory that holds data.
 *
 * Where MACROLINK_WRITTEN_LOG names a file, the size of each buffer
 * written is appended to it, one decimal line each, so that the caller
 * can tell that the library reached the buffers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* UCP's ABI (ucp/api/ucp.h): ucs_status_t, ucp_mem_attr_t and the
 * fields asked of ucp_mem_query. */
typedef int ucs_status_t;
typedef struct {
    uint64_t field_mask;
    void *address;
    size_t length;
    int mem_type;
} mem_attr_t;
#define ATTR_ADDRESS 1u
#define ATTR_LENGTH 2u

typedef ucs_status_t (*map_fn)(void *context, const void *params, void **memh);
typedef ucs_status_t (*query_fn)(void *memh, mem_attr_t *attr);

static void note(size_t length) {
    const char *path = getenv("MACROLINK_WRITTEN_LOG");
    if (path == NULL) {
        return;
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        return;
    }
    char line[32];
    int n = snprintf(line, sizeof line, "%zu\n", length);
    if (n > 0 && write(fd, line, (size_t)n) < 0) {
        /* Nothing written: the caller finds the buffer missing. */
    }
    close(fd);
}

ucs_status_t ucp_mem_map(void *context, const void *params, void **memh) {
    map_fn real = (map_fn)dlsym(RTLD_NEXT, "ucp_mem_map");
    query_fn query = (query_fn)dlsym(RTLD_NEXT, "ucp_mem_query");
    if (real == NULL) {
        return -1; /* UCS_ERR_NO_MESSAGE */
    }
    ucs_status_t s = real(context, params, memh);
    if (s != 0 || query == NULL) {
        return s;
    }
    mem_attr_t a = {ATTR_ADDRESS | ATTR_LENGTH, NULL, 0, 0};
    if (query(*memh, &a) == 0 && a.address != NULL && a.length > 0) {
        memset(a.address, 0xa5, a.length);
        note(a.length);
    }
    return s;
}
