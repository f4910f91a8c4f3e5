// tcp-a2a-floor: the work an all-to-all cannot avoid over tcp loopback
// among N processes of one host, and nothing else: every pair of ranks
// holds one connection (non-blocking, TCP_NODELAY), and a call sends this
// rank's block for each peer down that peer's socket while it receives the
// peer's block for it, in the pairwise order (peer me+k sent to, me-k
// received from, k = 1..N-1, all in flight at once). No headers, no
// acknowledgements, no barrier between calls — calls run back to back as a
// benchmark loop issues them, and TCP's flow control is the only one. Rank
// 0 prints the mean time of a call over CALLS (after WARMUP), and the
// busbw nccl-tests would print for it.
//
//   gcc -O2 -o /tmp/tcp-a2a-floor scripts/tcp-a2a-floor.c
//   /tmp/tcp-a2a-floor N BYTES CALLS WARMUP [spin] [bind]
//
// BYTES is the whole send buffer (a block of BYTES/N for each rank, as
// `hcomm bench alltoall -b BYTES` and coll_bench -o alltoall count it).
// Without "spin" a rank waits in poll(2) for any of its sockets; with it,
// it retries its non-blocking calls and yields the processor
// (sched_yield) when a round moved nothing, as a busy-polling library
// does. "bind" binds rank r to processor r mod P, as `hcomm run` does with
// more ranks than processors. BENCHMARKS.md (stop 44) has what it measured
// for 4 processes and 64 KiB on the 2-core VM.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 64

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }

int main(int argc, char **argv) {
  if (argc < 5) { fprintf(stderr, "usage: %s N BYTES CALLS WARMUP [spin] [bind]\n", argv[0]); return 2; }
  int n = atoi(argv[1]); size_t bytes = strtoull(argv[2], 0, 0); int iters = atoi(argv[3]), warm = atoi(argv[4]);
  int spin = 0, pin = 0;
  for (int i = 5; i < argc; i++) { spin |= !strcmp(argv[i], "spin"); pin |= !strcmp(argv[i], "bind"); }
  if (n < 2 || n > MAXN || bytes % n) { fprintf(stderr, "N in 2..%d, BYTES a multiple of N\n", MAXN); return 2; }
  int port0 = 20000 + (getpid() % 20000);
  int lfd[MAXN];
  for (int r = 0; r < n; r++) { // every rank's listener, made before the fork
    lfd[r] = socket(AF_INET, SOCK_STREAM, 0); int one = 1; setsockopt(lfd[r], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port0 + r), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd[r], (void *)&a, sizeof a) || listen(lfd[r], MAXN)) { perror("bind"); return 1; }
  }
  int me = 0;
  for (int r = 1; r < n; r++) if (fork() == 0) { me = r; break; }
  if (pin) {
    cpu_set_t all, one; CPU_ZERO(&one); sched_getaffinity(0, sizeof all, &all);
    int p = CPU_COUNT(&all), k = me % p;
    for (int c = 0; c < CPU_SETSIZE; c++) if (CPU_ISSET(c, &all) && k-- == 0) { CPU_SET(c, &one); break; }
    sched_setaffinity(0, sizeof one, &one);
  }
  int fd[MAXN];
  // Rank a < b: a connects to b's listener and says who it is; b accepts.
  for (int p = me + 1; p < n; p++) {
    fd[p] = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port0 + p), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    while (connect(fd[p], (void *)&a, sizeof a)) { close(fd[p]); usleep(1000); fd[p] = socket(AF_INET, SOCK_STREAM, 0); }
    unsigned char who = me; if (write(fd[p], &who, 1) != 1) { perror("write"); return 1; }
  }
  for (int k = 0; k < me; k++) {
    int c = accept(lfd[me], 0, 0); unsigned char who;
    if (c < 0 || read(c, &who, 1) != 1 || who >= me) { perror("accept"); return 1; }
    fd[who] = c;
  }
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    int one = 1; setsockopt(fd[p], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd[p], F_SETFL, O_NONBLOCK);
  }
  size_t blk = bytes / n;
  char *sbuf = malloc(bytes), *rbuf = malloc(bytes);
  memset(sbuf, me, bytes);
  double t0 = 0;
  for (int it = -warm; it < iters; it++) {
    if (it == 0) t0 = now();
    size_t sn[MAXN], rn[MAXN]; int left = 2 * (n - 1);
    for (int p = 0; p < n; p++) sn[p] = rn[p] = p == me ? 0 : blk;
    memcpy(rbuf + me * blk, sbuf + me * blk, blk);
    while (left) {
      struct pollfd pf[2 * MAXN]; int np = 0, moved = 0;
      for (int k = 1; k < n; k++) {
        int to = (me + k) % n, from = (me - k + n) % n;
        if (sn[to]) pf[np++] = (struct pollfd){fd[to], POLLOUT, spin ? POLLOUT : 0};
        if (rn[from]) pf[np++] = (struct pollfd){fd[from], POLLIN, spin ? POLLIN : 0};
      }
      if (!spin && poll(pf, np, -1) < 0) { perror("poll"); return 1; }
      for (int i = 0; i < np; i++) {
        int p = -1;
        for (int q = 0; q < n; q++) if (q != me && fd[q] == pf[i].fd) p = q;
        if ((pf[i].events & POLLOUT) && (pf[i].revents & POLLOUT)) {
          ssize_t k = send(fd[p], sbuf + p * blk + (blk - sn[p]), sn[p], MSG_DONTWAIT);
          if (k > 0) { sn[p] -= k; moved = 1; if (!sn[p]) left--; }
          else if (k < 0 && errno != EAGAIN) { perror("send"); return 1; }
        }
        if ((pf[i].events & POLLIN) && (pf[i].revents & (POLLIN | POLLHUP))) {
          ssize_t k = recv(fd[p], rbuf + p * blk + (blk - rn[p]), rn[p], MSG_DONTWAIT);
          if (k > 0) { rn[p] -= k; moved = 1; if (!rn[p]) left--; }
          else if (k == 0 || (k < 0 && errno != EAGAIN)) { perror("recv"); return 1; }
        }
      }
      if (spin && !moved) sched_yield();
    }
  }
  double us = (now() - t0) / iters;
  if (me == 0) {
    double busbw = bytes / us / 1e3 * (n - 1) / n;
    printf("tcp-a2a-floor n=%d bytes=%zu%s%s mean %.2f us busbw %.3f GB/s\n", n, bytes, spin ? " spin" : "", pin ? " bind" : "", us, busbw);
    for (int r = 1; r < n; r++) wait(0);
  }
  return 0;
}
