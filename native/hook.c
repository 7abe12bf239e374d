/* snapshotd-hook: the native agent hook entry, a relay to the daemon's `hook` method.
 *
 * Run as  snapshotd-hook PYTHON -I -S .../hookentry.py TOOL  (what `integrate` writes): argv[1..] is
 * the Python entry, run (exec'd, with the same stdin bytes) whenever anything is not the ordinary case.
 * The ordinary case: the payload arrives on stdin, the daemon's socket folder and listener pass the
 * rules of snapshotd.client.onecall (a folder of this user's that no one else may write to, a listener
 * of this user's by SO_PEERCRED), the daemon answers a ping within PING_WAIT_MS, then the `hook`
 * request, whose answer holds the hook's stdout and stderr (base64), written out as they are.
 * Every rule of the hook itself (the payload, the label, the session's order, the records, what is
 * said) is the daemon's, in Python (snapshotd/agents/hookserve.py); nothing of it is here.
 *
 * The socket is $SNAPSHOTD_SOCKET, else $XDG_RUNTIME_DIR/snapshotd/snapshotd.sock when that is
 * absolute, else /tmp/snapshotd-<uid>/snapshotd.sock (snapshotd.settings.resolve_socket_path); a
 * relative one, or $SNAPSHOTD_DISABLE set, takes the Python entry.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define STDIN_WAIT_MS 5000     /* snapshotd.agents.payload.STDIN_WAIT_S */
#define PING_WAIT_MS 2000      /* a daemon that answers no ping by then: the Python entry, which waits longer */
#define ANSWER_WAIT_MS 59000   /* the agent ends the hook at HOOK_TIMEOUT_S (60 s); the daemon answers by its budget */
#define PAYLOAD_LIMIT (16 << 20)
#define REPLY_LIMIT (64 << 20)
#define HOOK_VERSION 1         /* snapshotd.agents.hookserve.VERSION */

/* snapshotd.settings.HOOK_ENVIRONMENT */
static const char *const ENVIRONMENT[] = {
    "CLAUDE_PROJECT_DIR", "HOME", "XDG_DATA_HOME", "SNAPSHOTD_HOME", "SNAPSHOTD_HOOK_BEFORE_BUDGET",
    "SNAPSHOTD_HOOK_BUDGET", NULL,
};

struct buf {
    char *data;
    size_t len, cap;
};

static int put(struct buf *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (grown == NULL) return -1;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int put_text(struct buf *b, const char *text) { return put(b, text, strlen(text)); }

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* "NAME":"<base64 of data>" */
static int put_b64(struct buf *b, const char *name, const unsigned char *data, size_t n) {
    char quad[4];
    if (put_text(b, "\"") || put_text(b, name) || put_text(b, "\":\"")) return -1;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)data[i] << 16 | (i + 1 < n ? (unsigned)data[i + 1] << 8 : 0) | (i + 2 < n ? data[i + 2] : 0);
        quad[0] = B64[v >> 18 & 63];
        quad[1] = B64[v >> 12 & 63];
        quad[2] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        quad[3] = i + 2 < n ? B64[v & 63] : '=';
        if (put(b, quad, 4)) return -1;
    }
    return put_text(b, "\"");
}

static int b64_value(char c) {
    const char *at = c ? strchr(B64, c) : NULL;
    return at ? (int)(at - B64) : -1;
}

/* The bytes of the base64 string after "NAME":" in `line`, written to `fd`; -1 if it is not there. */
static int write_b64_field(const char *line, const char *name, int fd) {
    char key[64];
    snprintf(key, sizeof key, "\"%s\":\"", name);
    const char *at = strstr(line, key);
    if (at == NULL) return -1;
    at += strlen(key);
    struct buf out = {0};
    unsigned v = 0;
    int bits = 0;
    for (; *at && *at != '"'; at++) {
        if (*at == '=') continue;
        int d = b64_value(*at);
        if (d < 0) { free(out.data); return -1; }
        v = (v << 6 | (unsigned)d) & 0xffffff;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            char c = (char)(v >> bits & 0xff);
            if (put(&out, &c, 1)) { free(out.data); return -1; }
        }
    }
    if (*at != '"') { free(out.data); return -1; }
    for (size_t done = 0; done < out.len;) {
        ssize_t n = write(fd, out.data + done, out.len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* the agent closed its end: nothing more to tell it */
        done += (size_t)n;
    }
    free(out.data);
    return 0;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int wait_for(int fd, short events, long long deadline) {
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)(left > 60000 ? 60000 : left));
        if (n > 0) return 1;
        if (n < 0 && errno != EINTR) return -1;
    }
}

/* Run the Python entry (argv[1..]) with `payload` as its stdin (when it was read); never returns. */
static void fall_back(char **argv, const struct buf *payload) __attribute__((noreturn));
static void fall_back(char **argv, const struct buf *payload) {
    if (payload != NULL) {
        int fd = -1;
#ifdef MFD_CLOEXEC
        fd = memfd_create("snapshotd-hook-payload", 0);
#endif
        if (fd >= 0) {
            size_t done = 0;
            while (done < payload->len) {
                ssize_t n = write(fd, payload->data + done, payload->len - done);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) break;
                done += (size_t)n;
            }
            lseek(fd, 0, SEEK_SET);
        } else {
            int ends[2];
            if (pipe(ends) == 0) {
                pid_t feeder = payload->len > 65536 ? fork() : 0;
                if (feeder == 0) { /* the pipe holds 64 KiB; a larger payload gets a process that writes it */
                    size_t done = 0;
                    close(ends[0]);
                    while (done < payload->len) {
                        ssize_t n = write(ends[1], payload->data + done, payload->len - done);
                        if (n < 0 && errno == EINTR) continue;
                        if (n <= 0) break;
                        done += (size_t)n;
                    }
                    if (payload->len > 65536) _exit(0);
                }
                close(ends[1]);
                fd = ends[0];
            }
        }
        if (fd >= 0 && fd != 0) {
            dup2(fd, 0);
            close(fd);
        }
    }
    execv(argv[1], argv + 1);
    fprintf(stderr, "snapshotd hook: cannot run %s (%s); run `snapshotd integrate` again.\n", argv[1], strerror(errno));
    exit(0); /* a hook never fails the agent */
}

static int send_all(int fd, const char *data, size_t n, long long deadline) {
    while (n > 0) {
        ssize_t sent = send(fd, data, n, MSG_NOSIGNAL);
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_for(fd, POLLOUT, deadline) <= 0) return -1;
            continue;
        }
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return -1;
        data += sent;
        n -= (size_t)sent;
    }
    return 0;
}

/* One reply line into `line` (without its newline); `rest` keeps what came after it. 0, or -1. */
static int read_line(int fd, struct buf *line, struct buf *rest, long long deadline) {
    char chunk[65536];
    line->len = 0;
    for (;;) {
        char *end = rest->len ? memchr(rest->data, '\n', rest->len) : NULL;
        if (end != NULL) {
            size_t n = (size_t)(end - rest->data);
            if (put(line, rest->data, n)) return -1;
            memmove(rest->data, end + 1, rest->len - n - 1);
            rest->len -= n + 1;
            return 0;
        }
        if (rest->len > REPLY_LIMIT || wait_for(fd, POLLIN, deadline) <= 0) return -1;
        ssize_t got = recv(fd, chunk, sizeof chunk, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) return -1;
        if (put(rest, chunk, (size_t)got)) return -1;
    }
}

static int starts_with(const struct buf *b, const char *prefix) {
    return b->len >= strlen(prefix) && memcmp(b->data, prefix, strlen(prefix)) == 0;
}

int main(int argc, char **argv) {
    long long started = now_ms();
    if (argc < 3) {
        fprintf(stderr, "snapshotd hook: usage: snapshotd-hook PYTHON-ENTRY... TOOL; run `snapshotd integrate` again.\n");
        return 0;
    }
    if (isatty(0) || (getenv("SNAPSHOTD_DISABLE") && *getenv("SNAPSHOTD_DISABLE"))) fall_back(argv, NULL);

    /* The payload, to its end or until the Python entry's wait has passed. */
    struct buf payload = {0};
    int late = 0;
    long long stdin_deadline = started + STDIN_WAIT_MS;
    for (;;) {
        char chunk[65536];
        int ready = wait_for(0, POLLIN, stdin_deadline);
        if (ready == 0) { late = 1; break; }
        if (ready < 0) fall_back(argv, &payload);
        ssize_t got = read(0, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fall_back(argv, &payload);
        if (got == 0) break;
        if (put(&payload, chunk, (size_t)got) || payload.len > PAYLOAD_LIMIT) fall_back(argv, &payload);
    }
    /* A payload that came too late is the daemon's to word (its Python says what the Python entry says). */

    /* The socket, and its folder by the clients' rule. */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    const char *named = getenv("SNAPSHOTD_SOCKET"), *runtime = getenv("XDG_RUNTIME_DIR");
    int length;
    if (named && *named) length = snprintf(path, sizeof path, "%s", named);
    else if (runtime && runtime[0] == '/') length = snprintf(path, sizeof path, "%s/snapshotd/snapshotd.sock", runtime);
    else length = snprintf(path, sizeof path, "/tmp/snapshotd-%u/snapshotd.sock", (unsigned)getuid());
    if (length <= 0 || (size_t)length >= sizeof path || path[0] != '/') fall_back(argv, &payload);
    char folder[sizeof path];
    memcpy(folder, path, sizeof path);
    *strrchr(folder, '/') = '\0';
    struct stat info;
    if (lstat(folder[0] ? folder : "/", &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != geteuid() ||
        (info.st_mode & 022))
        fall_back(argv, &payload);

    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un address = {0};
    address.sun_family = AF_UNIX;
    memcpy(address.sun_path, path, (size_t)length + 1);
    if (sock < 0 || connect(sock, (struct sockaddr *)&address, sizeof address) != 0) fall_back(argv, &payload);
#ifdef SO_PEERCRED
    struct ucred peer;
    socklen_t size = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || peer.uid != geteuid()) fall_back(argv, &payload);
#else
    fall_back(argv, &payload);
#endif

    /* A ping first: a daemon that answers it has run nothing of this hook, so the Python entry may still. */
    struct buf line = {0}, rest = {0}, request = {0};
    static const char PING[] = "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"ping\",\"params\":{}}\n";
    long long ping_deadline = now_ms() + PING_WAIT_MS;
    if (send_all(sock, PING, sizeof PING - 1, ping_deadline) || read_line(sock, &line, &rest, ping_deadline) ||
        !starts_with(&line, "{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":"))
        fall_back(argv, &payload);

    char number[64], cwd[65536];
    const char *tool = argv[argc - 1];
    int failed = put_text(&request, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hook\",\"params\":{");
    snprintf(number, sizeof number, "\"version\":%d,\"pid\":%ld,\"ppid\":%ld,", HOOK_VERSION, (long)getpid(), (long)getppid());
    failed |= put_text(&request, number);
    failed |= put_b64(&request, "tool", (const unsigned char *)tool, strlen(tool));
    if (!late) failed |= put_text(&request, ",") || put_b64(&request, "payload", (unsigned char *)payload.data, payload.len);
    if (getcwd(cwd, sizeof cwd) != NULL)
        failed |= put_text(&request, ",") || put_b64(&request, "cwd", (unsigned char *)cwd, strlen(cwd));
    failed |= put_text(&request, ",\"environ\":{");
    for (int i = 0, first = 1; ENVIRONMENT[i]; i++) {
        const char *value = getenv(ENVIRONMENT[i]);
        if (value == NULL) continue;
        failed |= (first ? 0 : put_text(&request, ",")) || put_b64(&request, ENVIRONMENT[i], (const unsigned char *)value, strlen(value));
        first = 0;
    }
    failed |= put_text(&request, "}}}\n");
    long long deadline = started + ANSWER_WAIT_MS;
    if (failed || send_all(sock, request.data, request.len, deadline)) fall_back(argv, &payload);

    /* From here the daemon may have run the hook: no Python entry after this, whatever happens. */
    if (read_line(sock, &line, &rest, deadline) != 0) {
        fprintf(stderr, "snapshotd hook: the daemon at %s did not answer the hook in time; run `snapshotd doctor`.\n", path);
        return 0;
    }
    if (!starts_with(&line, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{") || strstr(line.data, "\"fallback\":"))
        fall_back(argv, &payload); /* refused before it ran (an older daemon, too many hooks at once) */
    write_b64_field(line.data, "stdout", 1);
    write_b64_field(line.data, "stderr", 2);
    return 0;
}
