/* Preloaded into a peer's processes (peers::resident): one more thread in
 * each, that only sleeps, as a node of ours keeps its acceptors. */
#include <pthread.h>
#include <unistd.h>

static void *sleeper(void *arg)
{
    for (;;)
        pause();
    return arg;
}

__attribute__((constructor)) static void start(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, sleeper, NULL) == 0)
        pthread_detach(t);
}
