// benchtool: the small load and measurement tools the fencegate benchmark needs, in one binary.
// Plain C, no dependencies: `cc -O2 -o benchtool benchtool.c`. Loopback only (127.0.0.1).
//
//   benchtool upstream PORT
//       Single-threaded epoll HTTP/1.1 server. Every request (any method, any target) gets
//       "200 OK", Content-Length: 2, body "ok", after its whole request body has been read and
//       discarded (Content-Length or chunked). Keep-alive and pipelining; closes on
//       "Connection: close" or HTTP/1.0. Never buffers a body, so it is also the discarding
//       upstream for the 1 GiB upload. Prints "READY" once listening.
//   benchtool fsync DIR COUNT INTERVAL_MS
//       Raw sync reference, shaped like a SQLite WAL commit: pwrite 4 KiB at the next offset of
//       a preallocated 4 MB file in DIR (wrapping after 1000 pages like a checkpointed WAL, so
//       no size change: the cheapest case) then sync, one every INTERVAL_MS. COUNT/2 with fdatasync(2), then COUNT/2 with fsync(2).
//       Prints "n=.. fdatasync_p50_us=.. fdatasync_p99_us=.. ... fsync_p99_us=.. ...".
//   benchtool advance PORT PATH FIRST_TOKEN INTERVAL_MS SECONDS [SYNC_DIR]
//       Sequential generation advances over one keep-alive connection: POST PATH with
//       Fencing-Token FIRST_TOKEN, FIRST_TOKEN+1, ... (16-byte body), each waiting for the full
//       response, one every INTERVAL_MS, for SECONDS. Latency = send to last response byte.
//       With SYNC_DIR, halfway between two advances (never overlapping one) it also times a raw
//       4 KiB overwrite + sync of a preallocated file in SYNC_DIR, alternately fdatasync(2) and
//       fsync(2): the raw reference sampled in the same window, on the same disk and CPU.
//       Prints "n=.. ok=.. bad=.. advance_p50_us=.. advance_p99_us=.. advance_mean_us=.. fdatasync_p99_us=.. ...".
//   benchtool idle PORT N TOKEN
//       Opens N connections, sends one fenced POST (16-byte body) on each, reads each response,
//       and keeps them all open. Prints "READY opened=.. ok=.. failed=.." then waits until
//       stdin closes (or SIGTERM), then exits.
//   benchtool tlsnew PORT SECONDS TOKEN            (built with -DBENCH_TLS -lssl -lcrypto)
//       Issue 29: new TLS connections, one after another for SECONDS: connect, a full TLS 1.3
//       handshake (no session cache, no tickets: never resumed; the certificate is not verified,
//       the bench made it), one fenced POST with "Connection: close", read the response, close.
//       Prints "conns=.. ok=.. bad=.. seconds=.. per_s=.. p50_us=.. p99_us=.." (connect to response).
//   benchtool tlsidle PORT N TOKEN                 (built with -DBENCH_TLS)
//       `idle` over TLS 1.3: N connections, each with its handshake and one fenced POST, kept open.
//   benchtool upload PORT PATH BYTES TOKEN
//       One POST of BYTES zero bytes (Content-Length, generated on the fly, never held),
//       then reads the response. Prints "status=.. bytes=.. seconds=.. mib_per_s=..".
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static void die(const char* what) {
  perror(what);
  exit(1);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_until(int64_t t_ns) {
  struct timespec ts = {.tv_sec = t_ns / 1000000000LL, .tv_nsec = t_ns % 1000000000LL};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

static int cmp_i64(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return x < y ? -1 : x > y;
}

// Nearest-rank percentile of sorted values.
static int64_t pct(const int64_t* v, size_t n, double p) {
  if (n == 0) return 0;
  size_t rank = (size_t)((p / 100.0) * (double)n + 0.999999);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return v[rank - 1];
}

static int connect_lo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr*)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

// Case-insensitive search for header NAME (with the colon) in a head of length n; returns a
// pointer to the value (after optional spaces) or NULL.
static const char* find_header(const char* head, size_t n, const char* name) {
  size_t ln = strlen(name);
  for (size_t i = 0; i + ln < n; i++) {
    if ((i == 0 || head[i - 1] == '\n') && strncasecmp(head + i, name, ln) == 0) {
      const char* v = head + i + ln;
      while (*v == ' ' || *v == '\t') v++;
      return v;
    }
  }
  return NULL;
}

// The upstream's view of a request head, from one pass over its lines (the upstream shares its
// core with wrk, so what it spends per request caps every target's rate).
typedef struct {
  long long content_length;  // -1: none
  int chunked;
  int close;  // "Connection: close" or HTTP/1.0
} head_info_t;

static int line_is(const char* line, size_t len, const char* name, size_t ln, const char** value) {
  if (len < ln || strncasecmp(line, name, ln) != 0) return 0;
  const char* v = line + ln;
  while (*v == ' ' || *v == '\t') v++;
  *value = v;
  return 1;
}

static head_info_t scan_request_head(const char* head, size_t head_len) {
  head_info_t h = {.content_length = -1};
  const char* end = head + head_len;
  const char* eol = memchr(head, '\n', head_len);
  if (!eol) return h;
  const int http10 = eol - head >= 9 && memcmp(eol - 9, "HTTP/1.0", 8) == 0;
  for (const char* line = eol + 1; line < end; line = eol + 1) {
    eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol) break;
    const size_t len = (size_t)(eol - line);
    const char* v;
    switch (line[0] | 0x20) {  // only the three names it needs are compared
      case 'c':
        if (line_is(line, len, "content-length:", 15, &v)) h.content_length = atoll(v);
        else if (line_is(line, len, "connection:", 11, &v)) h.close = strncasecmp(v, "close", 5) == 0;
        break;
      case 't':
        if (line_is(line, len, "transfer-encoding:", 18, &v)) h.chunked = strncasecmp(v, "chunked", 7) == 0;
        break;
    }
  }
  h.close |= http10;
  return h;
}

static const char* find_crlfcrlf(const char* p, size_t n) {
  return memmem(p, n, "\r\n\r\n", 4);
}

// Reads one HTTP response with a Content-Length body from a blocking fd. Returns the status, or
// -1 on error/EOF. `buf` holds leftovers between calls (pipelining is not used, so none expected).
static int read_response(int fd) {
  char buf[65536];
  size_t have = 0;
  for (;;) {
    ssize_t r = read(fd, buf + have, sizeof buf - have);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return -1;
    }
    have += (size_t)r;
    const char* end = find_crlfcrlf(buf, have);
    if (!end) {
      if (have == sizeof buf) return -1;
      continue;
    }
    size_t head_len = (size_t)(end - buf) + 4;
    int status = 0;
    if (have < 12 || sscanf(buf, "HTTP/1.%*d %d", &status) != 1) return -1;
    const char* cl = find_header(buf, head_len, "content-length:");
    long long body = cl ? atoll(cl) : 0;
    long long got = (long long)(have - head_len);
    while (got < body) {
      r = read(fd, buf, sizeof buf);
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        return -1;
      }
      got += r;
    }
    return status;
  }
}

// ---------------------------------------------------------------- upstream

enum { ST_HEAD, ST_BODY, ST_CHUNK_SIZE, ST_CHUNK_DATA, ST_CHUNK_CRLF, ST_TRAILER };

typedef struct {
  int fd;
  int state;
  long long remaining;  // body bytes (ST_BODY) or chunk bytes (ST_CHUNK_DATA) still to discard
  int close_after;
  size_t len;  // bytes in buf not yet consumed
  char buf[16384];
} conn_t;

static const char kResp[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";

// Consumes as much of c->buf as possible, appending responses to out. Returns -1 to close.
static int up_consume(conn_t* c, char* out, size_t* outlen, size_t outcap) {
  size_t pos = 0;
  for (;;) {
    char* p = c->buf + pos;
    size_t n = c->len - pos;
    if (c->state == ST_HEAD) {
      const char* end = find_crlfcrlf(p, n);
      if (!end) {
        if (n >= sizeof c->buf) return -1;  // head too large
        break;
      }
      size_t head_len = (size_t)(end - p) + 4;
      const head_info_t h = scan_request_head(p, head_len);
      c->close_after = h.close;
      pos += head_len;
      if (h.chunked) {
        c->state = ST_CHUNK_SIZE;
      } else if (h.content_length > 0) {
        c->state = ST_BODY;
        c->remaining = h.content_length;
      } else {
        c->state = ST_HEAD;
        goto respond;
      }
      continue;
    }
    if (c->state == ST_BODY || c->state == ST_CHUNK_DATA) {
      if (n == 0) break;
      size_t take = n < (size_t)c->remaining ? n : (size_t)c->remaining;
      pos += take;
      c->remaining -= (long long)take;
      if (c->remaining > 0) break;
      if (c->state == ST_CHUNK_DATA) {
        c->state = ST_CHUNK_CRLF;
        continue;
      }
      c->state = ST_HEAD;
      goto respond;
    }
    if (c->state == ST_CHUNK_SIZE || c->state == ST_CHUNK_CRLF || c->state == ST_TRAILER) {
      const char* eol = memmem(p, n, "\r\n", 2);
      if (!eol) {
        if (n >= sizeof c->buf) return -1;
        break;
      }
      size_t line = (size_t)(eol - p);
      pos += line + 2;
      if (c->state == ST_CHUNK_CRLF) {
        c->state = ST_CHUNK_SIZE;
      } else if (c->state == ST_CHUNK_SIZE) {
        long long sz = strtoll(p, NULL, 16);
        if (sz > 0) {
          c->state = ST_CHUNK_DATA;
          c->remaining = sz;
        } else {
          c->state = ST_TRAILER;
        }
      } else if (line == 0) {  // end of trailers
        c->state = ST_HEAD;
        goto respond;
      }
      continue;
    }
    break;
  respond:
    if (*outlen + sizeof kResp > outcap) return -1;
    memcpy(out + *outlen, kResp, sizeof kResp - 1);
    *outlen += sizeof kResp - 1;
    if (c->close_after) {
      c->len = 0;
      return 1;
    }
  }
  memmove(c->buf, c->buf + pos, c->len - pos);
  c->len -= pos;
  return 0;
}

__attribute__((noreturn)) static void cmd_upstream(int port) {
  signal(SIGPIPE, SIG_IGN);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr*)&a, sizeof a) < 0) die("bind");
  if (listen(ls, 4096) < 0) die("listen");
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  printf("READY\n");
  fflush(stdout);
  struct epoll_event evs[256];
  static char out[65536];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("epoll_wait");
    }
    for (int i = 0; i < n; i++) {
      conn_t* c = evs[i].data.ptr;
      if (!c) {
        for (;;) {
          int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
          if (fd < 0) break;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conn_t* nc = calloc(1, sizeof *nc);
          nc->fd = fd;
          struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
        }
        continue;
      }
      int closeit = 0;
      size_t outlen = 0;
      for (int rounds = 0; rounds < 16; rounds++) {
        ssize_t r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
        if (r == 0) {
          closeit = 1;
          break;
        }
        if (r < 0) {
          if (errno != EAGAIN && errno != EINTR) closeit = 1;
          break;
        }
        c->len += (size_t)r;
        int rc = up_consume(c, out, &outlen, sizeof out);
        if (rc != 0) {
          closeit = 1;
          break;
        }
        if (c->len < sizeof c->buf && (size_t)r < sizeof c->buf / 2) break;  // likely drained
      }
      // Small responses to a blocking-enough loopback socket: a short write is treated as fatal.
      if (outlen > 0 && write_all(c->fd, out, outlen) < 0) closeit = 1;
      if (closeit) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        free(c);
      }
    }
  }
}

// ---------------------------------------------------------------- fsync

// One pass of COUNT writes+syncs; returns sorted latencies in ns (caller frees).
static int64_t* fsync_pass(int fd, int count, int interval_ms, int data_only) {
  static char block[4096];
  const off_t wal_pages = 1000;  // SQLite checkpoints its WAL at 1000 pages and restarts it
  int64_t* lat = calloc((size_t)count, sizeof *lat);
  int64_t next = now_ns();
  for (int i = 0; i < count; i++) {
    memset(block, i & 0xff, sizeof block);
    int64_t t0 = now_ns();
    if (pwrite(fd, block, sizeof block, (off_t)(i % wal_pages) * (off_t)sizeof block) != (ssize_t)sizeof block)
      die("pwrite");
    if ((data_only ? fdatasync(fd) : fsync(fd)) < 0) die("sync");
    lat[i] = now_ns() - t0;
    next += (int64_t)interval_ms * 1000000LL;
    sleep_until(next);
  }
  qsort(lat, (size_t)count, sizeof *lat, cmp_i64);
  return lat;
}

static int cmd_fsync(const char* dir, int count, int interval_ms) {
  char path[4096];
  snprintf(path, sizeof path, "%s/fsync-bench.dat", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) die("open");
  // Preallocate (written and synced once), so the timed syncs overwrite allocated blocks: the
  // cheapest case, like a SQLite WAL being reused after a checkpoint.
  static char zeros[65536];
  for (int i = 0; i < 1000 * 4096 / (int)sizeof zeros + 1; i++)
    if (write_all(fd, zeros, sizeof zeros) < 0) die("write");
  if (fsync(fd) < 0) die("fsync");
  // Two passes, half the count each: fdatasync(2) (what SQLite issues for a WAL commit on
  // Linux) and fsync(2).
  int half = count / 2 > 0 ? count / 2 : 1;
  int64_t* ds = fsync_pass(fd, half, interval_ms, 1);
  int64_t* fs = fsync_pass(fd, half, interval_ms, 0);
  close(fd);
  unlink(path);
  printf("n=%d fdatasync_p50_us=%lld fdatasync_p99_us=%lld fdatasync_max_us=%lld "
         "fsync_p50_us=%lld fsync_p99_us=%lld fsync_max_us=%lld\n",
         half, (long long)pct(ds, (size_t)half, 50) / 1000, (long long)pct(ds, (size_t)half, 99) / 1000,
         (long long)ds[half - 1] / 1000, (long long)pct(fs, (size_t)half, 50) / 1000,
         (long long)pct(fs, (size_t)half, 99) / 1000, (long long)fs[half - 1] / 1000);
  free(ds);
  free(fs);
  return 0;
}

// ---------------------------------------------------------------- advance

static void print_stats(const char* name, int64_t* v, size_t n) {
  qsort(v, n, sizeof *v, cmp_i64);
  long long sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  printf(" %s_n=%zu %s_p50_us=%lld %s_p99_us=%lld %s_max_us=%lld %s_mean_us=%lld", name, n, name,
         (long long)pct(v, n, 50) / 1000, name, (long long)pct(v, n, 99) / 1000, name,
         (long long)(n ? v[n - 1] : 0) / 1000, name, n ? sum / (long long)n / 1000 : 0LL);
}

static int cmd_advance(int port, const char* path, long long first, int interval_ms, int seconds,
                       const char* sync_dir) {
  signal(SIGPIPE, SIG_IGN);
  int fd = connect_lo(port);
  if (fd < 0) die("connect");
  int sfd = -1;
  static char block[4096];
  const off_t wal_pages = 1000;
  if (sync_dir) {  // same preallocated-file shape as `benchtool fsync`
    char spath[4096];
    snprintf(spath, sizeof spath, "%s/advance-sync-bench.dat", sync_dir);
    sfd = open(spath, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (sfd < 0) die("open sync file");
    unlink(spath);
    for (off_t i = 0; i < wal_pages; i++)
      if (write_all(sfd, block, sizeof block) < 0) die("write");
    if (fsync(sfd) < 0) die("fsync");
  }
  size_t cap = (size_t)seconds * 1000 / (size_t)(interval_ms > 0 ? interval_ms : 1) + 16;
  int64_t* lat = calloc(cap, sizeof *lat);
  int64_t* ds = calloc(cap, sizeof *ds);
  int64_t* fs = calloc(cap, sizeof *fs);
  size_t n = 0, nds = 0, nfs = 0, ok = 0, bad = 0;
  int last_status = 0;
  int64_t interval = (int64_t)interval_ms * 1000000LL;
  int64_t start = now_ns(), next = start, stop = start + (int64_t)seconds * 1000000000LL;
  long long token = first;
  char req[512];
  while (now_ns() < stop && n < cap) {
    int len = snprintf(req, sizeof req,
                       "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: %lld\r\n"
                       "Fencing-Leader: bench-advancer\r\nContent-Type: application/octet-stream\r\n"
                       "Content-Length: 16\r\n\r\n0123456789abcdef",
                       path, token);
    int64_t t0 = now_ns();
    if (write_all(fd, req, (size_t)len) < 0) die("write");
    int status = read_response(fd);
    int64_t dt = now_ns() - t0;
    if (status < 0) {  // connection lost: reconnect, count as bad
      close(fd);
      fd = connect_lo(port);
      if (fd < 0) die("reconnect");
      bad++;
    } else if (status == 200) {
      ok++;
    } else {
      bad++;
    }
    last_status = status;
    lat[n] = dt;
    // Halfway to the next advance, never overlapping one: a raw sync of a 4 KiB overwrite,
    // alternately fdatasync(2) (what SQLite issues) and fsync(2).
    if (sfd >= 0) {
      int64_t half = next + interval / 2;
      if (half > now_ns()) sleep_until(half);
      memset(block, (int)(n & 0xff), sizeof block);
      int64_t s0 = now_ns();
      if (pwrite(sfd, block, sizeof block, (off_t)(n % (size_t)wal_pages) * (off_t)sizeof block) != (ssize_t)sizeof block)
        die("pwrite");
      if (n % 2 == 0) {
        if (fdatasync(sfd) < 0) die("fdatasync");
        ds[nds++] = now_ns() - s0;
      } else {
        if (fsync(sfd) < 0) die("fsync");
        fs[nfs++] = now_ns() - s0;
      }
    }
    n++;
    token++;
    next += interval;
    if (next > now_ns()) sleep_until(next);
  }
  close(fd);
  if (sfd >= 0) close(sfd);
  printf("n=%zu ok=%zu bad=%zu last_status=%d last_token=%lld", n, ok, bad, last_status, token - 1);
  print_stats("advance", lat, n);
  if (sfd >= 0) {
    print_stats("fdatasync", ds, nds);
    print_stats("fsync", fs, nfs);
  }
  printf("\n");
  return 0;
}

// ---------------------------------------------------------------- idle

static volatile sig_atomic_t g_stop = 0;
static void on_term(int sig) {
  (void)sig;
  g_stop = 1;
}

static int cmd_idle(int port, int count, const char* token) {
  signal(SIGPIPE, SIG_IGN);
  int* fds = calloc((size_t)count, sizeof *fds);
  char req[512];
  int len = snprintf(req, sizeof req,
                     "POST /idle HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: %s\r\n"
                     "Content-Type: application/octet-stream\r\nContent-Length: 16\r\n\r\n0123456789abcdef",
                     token);
  int opened = 0, ok = 0, failed = 0;
  // Open and request in batches so the accept backlog never overflows.
  const int batch = 200;
  for (int base = 0; base < count; base += batch) {
    int end = base + batch < count ? base + batch : count;
    for (int i = base; i < end; i++) {
      fds[i] = connect_lo(port);
      if (fds[i] < 0) {
        failed++;
        continue;
      }
      opened++;
      if (write_all(fds[i], req, (size_t)len) < 0) {
        close(fds[i]);
        fds[i] = -1;
        failed++;
      }
    }
    for (int i = base; i < end; i++) {
      if (fds[i] < 0) continue;
      struct pollfd p = {.fd = fds[i], .events = POLLIN};
      if (poll(&p, 1, 10000) != 1) {
        failed++;
        continue;
      }
      int st = read_response(fds[i]);
      if (st == 200)
        ok++;
      else
        failed++;
    }
  }
  printf("READY opened=%d ok=%d failed=%d\n", opened, ok, failed);
  fflush(stdout);
  signal(SIGTERM, on_term);
  char b[64];
  while (!g_stop) {
    ssize_t r = read(0, b, sizeof b);
    if (r == 0 || (r < 0 && errno != EINTR)) break;
  }
  for (int i = 0; i < count; i++)
    if (fds[i] >= 0) close(fds[i]);
  return 0;
}

// ---------------------------------------------------------------- upload

static int cmd_upload(int port, const char* path, long long bytes, const char* token) {
  signal(SIGPIPE, SIG_IGN);
  int fd = connect_lo(port);
  if (fd < 0) die("connect");
  char head[512];
  int len = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: %s\r\n"
                     "Content-Type: application/octet-stream\r\nContent-Length: %lld\r\n\r\n",
                     path, token, bytes);
  int64_t t0 = now_ns();
  if (write_all(fd, head, (size_t)len) < 0) die("write head");
  static char chunk[256 * 1024];
  long long left = bytes;
  while (left > 0) {
    size_t n = left < (long long)sizeof chunk ? (size_t)left : sizeof chunk;
    if (write_all(fd, chunk, n) < 0) {
      fprintf(stderr, "upload: write failed after %lld bytes: %s\n", bytes - left, strerror(errno));
      break;
    }
    left -= (long long)n;
  }
  int status = read_response(fd);
  double secs = (double)(now_ns() - t0) / 1e9;
  printf("status=%d bytes=%lld seconds=%.3f mib_per_s=%.1f\n", status, bytes - left, secs,
         (double)(bytes - left) / 1048576.0 / secs);
  close(fd);
  return status == 200 ? 0 : 1;
}

// ---------------------------------------------------------------- TLS (issue 29)

#ifdef BENCH_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>

static SSL_CTX* tls_ctx(void) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) die("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);  // never resumed
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);  // the bench's own certificate
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);  // 10,000 idle clients in one process
  return ctx;
}

// One connection with its handshake. Returns NULL on failure (fd closed).
static SSL* tls_open(SSL_CTX* ctx, int port) {
  int fd = connect_lo(port);
  if (fd < 0) return NULL;
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) != 1) {
    SSL_free(ssl);
    close(fd);
    ERR_clear_error();
    return NULL;
  }
  return ssl;
}

static void tls_close(SSL* ssl) {
  int fd = SSL_get_fd(ssl);
  SSL_free(ssl);
  close(fd);
}

// Sends `req` and reads one response with a Content-Length body. Returns the status or -1.
static int tls_exchange(SSL* ssl, const char* req, int len) {
  if (SSL_write(ssl, req, len) != len) return -1;
  char buf[16384];
  size_t have = 0;
  for (;;) {
    int r = SSL_read(ssl, buf + have, (int)(sizeof buf - have));
    if (r <= 0) return -1;
    have += (size_t)r;
    const char* end = find_crlfcrlf(buf, have);
    if (!end) {
      if (have == sizeof buf) return -1;
      continue;
    }
    size_t head_len = (size_t)(end - buf) + 4;
    int status = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) return -1;
    const char* cl = find_header(buf, head_len, "content-length:");
    long long body = cl ? atoll(cl) : 0;
    long long got = (long long)(have - head_len);
    while (got < body) {
      r = SSL_read(ssl, buf, sizeof buf);
      if (r <= 0) return -1;
      got += r;
    }
    return status;
  }
}

static int tls_request(char* req, size_t cap, const char* token, int close_it) {
  return snprintf(req, cap,
                  "POST /tls HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: %s\r\n%s"
                  "Content-Type: application/octet-stream\r\nContent-Length: 16\r\n\r\n0123456789abcdef",
                  token, close_it ? "Connection: close\r\n" : "");
}

static int cmd_tlsnew(int port, int seconds, const char* token) {
  signal(SIGPIPE, SIG_IGN);
  SSL_CTX* ctx = tls_ctx();
  char req[512];
  int len = tls_request(req, sizeof req, token, 1);
  size_t cap = 1 << 20, n = 0;
  int64_t* lat = malloc(cap * sizeof *lat);
  int ok = 0, bad = 0;
  int64_t t0 = now_ns(), end = t0 + (int64_t)seconds * 1000000000LL;
  while (now_ns() < end) {
    int64_t s = now_ns();
    SSL* ssl = tls_open(ctx, port);
    int st = ssl ? tls_exchange(ssl, req, len) : -1;
    if (ssl) {
      SSL_shutdown(ssl);  // close_notify, one way: the server closes after its response anyway
      tls_close(ssl);
    }
    if (st == 200) {
      ok++;
      if (n < cap) lat[n++] = now_ns() - s;
    } else {
      bad++;
    }
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  qsort(lat, n, sizeof *lat, cmp_i64);
  printf("conns=%d ok=%d bad=%d seconds=%.3f per_s=%.1f p50_us=%lld p99_us=%lld\n", ok + bad, ok, bad, secs,
         ok / secs, (long long)(pct(lat, n, 50) / 1000), (long long)(pct(lat, n, 99) / 1000));
  return bad == 0 ? 0 : 1;
}

static int cmd_tlsidle(int port, int count, const char* token) {
  signal(SIGPIPE, SIG_IGN);
  SSL_CTX* ctx = tls_ctx();
  SSL** conns = calloc((size_t)count, sizeof *conns);
  char req[512];
  int len = tls_request(req, sizeof req, token, 0);
  int opened = 0, ok = 0, failed = 0;
  for (int i = 0; i < count; i++) {
    conns[i] = tls_open(ctx, port);
    if (!conns[i]) {
      failed++;
      continue;
    }
    opened++;
    if (tls_exchange(conns[i], req, len) == 200) ok++;
    else failed++;
  }
  printf("READY opened=%d ok=%d failed=%d\n", opened, ok, failed);
  fflush(stdout);
  signal(SIGTERM, on_term);
  char b[64];
  while (!g_stop) {
    ssize_t r = read(0, b, sizeof b);
    if (r == 0 || (r < 0 && errno != EINTR)) break;
  }
  for (int i = 0; i < count; i++)
    if (conns[i]) tls_close(conns[i]);
  return 0;
}
#endif

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "upstream") == 0) cmd_upstream(atoi(argv[2]));
  if (argc >= 5 && strcmp(argv[1], "fsync") == 0) return cmd_fsync(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (argc >= 7 && strcmp(argv[1], "advance") == 0)
    return cmd_advance(atoi(argv[2]), argv[3], atoll(argv[4]), atoi(argv[5]), atoi(argv[6]), argc >= 8 ? argv[7] : NULL);
  if (argc >= 5 && strcmp(argv[1], "idle") == 0) return cmd_idle(atoi(argv[2]), atoi(argv[3]), argv[4]);
  if (argc >= 6 && strcmp(argv[1], "upload") == 0) return cmd_upload(atoi(argv[2]), argv[3], atoll(argv[4]), argv[5]);
#ifdef BENCH_TLS
  if (argc >= 5 && strcmp(argv[1], "tlsnew") == 0) return cmd_tlsnew(atoi(argv[2]), atoi(argv[3]), argv[4]);
  if (argc >= 5 && strcmp(argv[1], "tlsidle") == 0) return cmd_tlsidle(atoi(argv[2]), atoi(argv[3]), argv[4]);
#endif
  fprintf(stderr, "usage: see the comment at the top of bench/benchtool.c\n");
  return 2;
}
