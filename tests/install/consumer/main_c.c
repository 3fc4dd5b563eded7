/* Uses an installed devrt through its C interface, from C: allocates host memory, writes and
 * reads it, checks the statistics and an error. Exit code 0 when everything checks out. */
#include <stdio.h>
#include <string.h>

#include "devrt/c_api.h"

int main(void) {
  devrt_options o;
  devrt_options_default(&o);
  o.use_cuda = 0; /* the host device only, with or without GPUs */
  o.use_environment = 0;
  if (devrt_init(&o) != DEVRT_SUCCESS) {
    printf("devrt c consumer: FAILED (init: %s)\n", devrt_last_error());
    return 1;
  }
  unsigned char* p = NULL;
  if (devrt_malloc((void**)&p, 1 << 20, DEVRT_HOST_DEVICE, DEVRT_STREAM_DEVICE) != DEVRT_SUCCESS) {
    printf("devrt c consumer: FAILED (malloc: %s)\n", devrt_last_error());
    return 1;
  }
  for (int i = 0; i < (1 << 20); ++i) p[i] = (unsigned char)(i % 251);
  int same = 1;
  for (int i = 0; i < (1 << 20); ++i) same = same && p[i] == (unsigned char)(i % 251);
  devrt_stats s;
  memset(&s, 0, sizeof s);
  const int stats_ok = devrt_get_stats(DEVRT_HOST_DEVICE, &s) == DEVRT_SUCCESS;
  printf("devrt c consumer: %llu bytes in use in %llu allocation(s)\n", (unsigned long long)s.in_use_bytes,
         (unsigned long long)s.live_allocations);
  const int freed = devrt_free(p, DEVRT_HOST_DEVICE, DEVRT_STREAM_DEVICE) == DEVRT_SUCCESS;
  const int refused = devrt_free(p, DEVRT_HOST_DEVICE, DEVRT_STREAM_DEVICE) == DEVRT_ERROR_DOUBLE_FREE;
  devrt_shutdown();
  if (!same || !stats_ok || s.in_use_bytes != (1 << 20) || !freed || !refused) {
    printf("devrt c consumer: FAILED\n");
    return 1;
  }
  printf("devrt c consumer: ok\n");
  return 0;
}
