// tcp-ring-floor: the work a ring all-reduce of float32 cannot avoid over
// tcp loopback among N processes of one host, and nothing else: each rank
// sends its block to its successor while it receives its predecessor's (one
// non-blocking socket each way), adds what it received (the reduce-scatter,
// N-1 steps), then passes the reduced blocks on (the all-gather, N-1 steps).
// No headers, no acknowledgements, no staging copy: TCP's own flow control
// is the only one. Rank 0 prints the median and the fastest call.
//
//   gcc -O2 -march=native -o /tmp/tcp-ring-floor scripts/tcp-ring-floor.c
//   /tmp/tcp-ring-floor N BYTES CALLS WARMUP [spin]
//
// Without "spin" a rank waits in poll(2); with it, it retries its
// non-blocking calls and yields the processor (sched_yield) whenever one
// would block, as a busy-polling library does. BENCHMARKS.md (stop 41)
// has what it measured for 4 processes and 1 MiB on the 2-core VM.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>
static int spin;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

// xfer sends sn bytes from s on fd out while it receives rn bytes into r from fd in.
static void xfer(int out, const char *s, size_t sn, int in, char *r, size_t rn) {
  while (sn || rn) {
    struct pollfd p[2] = {{out, sn ? POLLOUT : 0, 0}, {in, rn ? POLLIN : 0, 0}};
    if (spin) { p[0].revents = POLLOUT; p[1].revents = POLLIN; } else if (poll(p, 2, -1) < 0) { perror("poll"); exit(1); }
    if (sn && (p[0].revents & POLLOUT)) { ssize_t k = send(out, s, sn, MSG_DONTWAIT); if (k > 0) { s += k; sn -= k; } else if (k < 0 && errno == EAGAIN && spin) sched_yield(); else if (k < 0 && errno != EAGAIN) { perror("send"); exit(1); } }
    if (rn && (p[1].revents & (POLLIN | POLLHUP))) { ssize_t k = recv(in, r, rn, MSG_DONTWAIT); if (k > 0) { r += k; rn -= k; } else if (k < 0 && errno == EAGAIN && spin) sched_yield(); else if (k == 0 || (k < 0 && errno != EAGAIN)) { perror("recv"); exit(1); } }
  }
}

int main(int argc, char **argv) {
  int n = atoi(argv[1]); size_t bytes = strtoull(argv[2], 0, 0); int iters = atoi(argv[3]), warm = atoi(argv[4]); spin = argc > 5;
  int port0 = 20000 + (getpid() % 20000);
  int lfd[64];
  for (int r = 0; r < n; r++) { // every rank's listener, made before the fork
    lfd[r] = socket(AF_INET, SOCK_STREAM, 0); int one = 1; setsockopt(lfd[r], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port0 + r), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd[r], (void *)&a, sizeof a) || listen(lfd[r], 4)) { perror("bind"); return 1; }
  }
  int me = 0;
  for (int r = 1; r < n; r++) if (fork() == 0) { me = r; break; }
  int out = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port0 + (me + 1) % n), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  while (connect(out, (void *)&a, sizeof a)) usleep(1000);
  int in = accept(lfd[me], 0, 0);
  int one = 1; setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(out, F_SETFL, O_NONBLOCK); fcntl(in, F_SETFL, O_NONBLOCK);
  size_t cnt = bytes / 4, blk = cnt / n;
  float *x = malloc(bytes), *t = malloc(blk * 4);
  for (size_t i = 0; i < cnt; i++) x[i] = me + 1;
  double *ts = malloc(sizeof(double) * iters);
  for (int it = -warm; it < iters; it++) {
    char c = 0; xfer(out, &c, 1, in, &c, 1); xfer(out, &c, 1, in, &c, 1); // a loose barrier
    double t0 = now();
    for (int s = 0; s < n - 1; s++) {
      int sb = ((me - s) % n + n) % n, rb = ((me - s - 1) % n + n) % n;
      xfer(out, (char *)(x + sb * blk), blk * 4, in, (char *)t, blk * 4);
      float *d = x + rb * blk;
      for (size_t i = 0; i < blk; i++) d[i] += t[i];
    }
    for (int s = 0; s < n - 1; s++) {
      int sb = ((me + 1 - s) % n + n) % n, rb = ((me - s) % n + n) % n;
      xfer(out, (char *)(x + sb * blk), blk * 4, in, (char *)(x + rb * blk), blk * 4);
    }
    if (it >= 0) ts[it] = now() - t0;
  }
  if (me == 0) {
    qsort(ts, iters, sizeof(double), cmp);
    printf("tcp-ring-floor n=%d bytes=%zu median %.1f us min %.1f us\n", n, bytes, ts[iters / 2], ts[0]);
    for (int r = 1; r < n; r++) wait(0);
  }
  return 0;
}
