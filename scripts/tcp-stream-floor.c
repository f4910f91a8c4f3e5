// tcp-stream-floor: the floor of a 2-process broadcast over tcp loopback —
// the unavoidable work of one call and nothing else. Per call the receiver
// says it is ready (8 bytes: its buffer is free, as a handshake's hello
// says), and the sender writes the message in pieces, which the receiver
// reads into its buffer; both ends busy-poll non-blocking sockets, as Open
// MPI's tcp progress and hcomm's waiters do. It prints the time a call
// takes, the time the sender spends in its writes, and the receiver's
// reads a call.
//
//   gcc -O2 -o /tmp/tcp-stream-floor scripts/tcp-stream-floor.c
//   /tmp/tcp-stream-floor [bytes [piece [calls [sockbuf]]]]
//
// Defaults: 1 MiB in pieces of 256 KiB (hcomm's netPiece), 2000 calls
// after 200 to warm up, socket buffers of 4 MiB set before connecting
// (hcomm's tcp.Options.SocketBuffer; 0 leaves them to autotuning).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long reads, empty;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
	perror(what);
	exit(1);
}

// readAll reads n bytes, polling: a read that finds nothing is tried again.
static void readAll(int fd, char *b, size_t n) {
	while (n) {
		reads++;
		ssize_t k = read(fd, b, n);
		if (k > 0) {
			b += k, n -= k;
		} else if (k < 0 && errno == EAGAIN) {
			empty++;
		} else {
			die(k == 0 ? "read: the peer closed" : "read");
		}
	}
}

static void writeAll(int fd, const char *b, size_t n) {
	while (n) {
		ssize_t k = write(fd, b, n);
		if (k > 0) {
			b += k, n -= k;
		} else if (k < 0 && errno != EAGAIN) {
			die("write");
		}
	}
}

static void setup(int fd, int sockbuf) {
	if (sockbuf > 0 && (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf) ||
	                    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf)))
		die("setsockopt");
}

int main(int argc, char **argv) {
	size_t size = argc > 1 ? strtoul(argv[1], 0, 0) : 1 << 20;
	size_t piece = argc > 2 ? strtoul(argv[2], 0, 0) : 256 << 10;
	int calls = argc > 3 ? atoi(argv[3]) : 2000, warm = 200;
	int sockbuf = argc > 4 ? atoi(argv[4]) : 4 << 20;
	if (size == 0 || piece == 0 || calls <= 0) {
		fprintf(stderr, "usage: %s [bytes [piece [calls [sockbuf]]]]: bytes, piece and calls positive\n", argv[0]);
		return 2;
	}
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	setup(l, sockbuf); // an accepted socket inherits the listener's buffers
	if (l < 0 || bind(l, (void *)&a, sizeof a) || listen(l, 1) || getsockname(l, (void *)&a, &al))
		die("listen");
	char *buf = malloc(size), ready[8] = {0};
	if (!buf)
		die("malloc");
	memset(buf, 1, size);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) { // the receiver
		int c = socket(AF_INET, SOCK_STREAM, 0);
		setup(c, sockbuf);
		if (c < 0 || connect(c, (void *)&a, sizeof a))
			die("connect");
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		fcntl(c, F_SETFL, O_NONBLOCK);
		for (int i = 0; i < warm + calls; i++) {
			if (i == warm)
				reads = empty = 0;
			writeAll(c, ready, sizeof ready);
			readAll(c, buf, size);
		}
		printf("receiver: %.1f reads a call, %.1f of them empty\n", (double)reads / calls, (double)empty / calls);
		return 0;
	}
	int c = accept(l, 0, 0);
	if (c < 0)
		die("accept");
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	fcntl(c, F_SETFL, O_NONBLOCK);
	double t0 = 0, writing = 0;
	for (int i = 0; i < warm + calls; i++) {
		if (i == warm)
			t0 = now(), writing = 0;
		readAll(c, ready, sizeof ready);
		double w = now();
		for (size_t lo = 0; lo < size; lo += piece)
			writeAll(c, buf + lo, lo + piece < size ? piece : size - lo);
		writing += now() - w;
	}
	double t = now() - t0;
	int status;
	waitpid(pid, &status, 0);
	printf("%zu bytes in pieces of %zu, socket buffers %d: %.1f us a call, %.1f of it writing\n",
	       size, piece, sockbuf, t / calls * 1e6, writing / calls * 1e6);
	return 0;
}
