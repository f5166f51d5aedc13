/*
 * What patchgym's two C command servers share: the Docker sandbox's (docker/server.c, pid 1 of its
 * container) and the local sandbox's init (sandbox_init.c, pid 1 of its bubblewrap namespaces).
 * Each includes this file once (every function is static) and adds its own operations.
 *
 * Requests and answers are length-prefixed binary messages (sandboxes/wire.py):
 *   request = u32 size, op (1 byte), fields;  answer = u32 size, status ('0' or 'E'), fields;
 *   field = u32 size, bytes (u32: big-endian)
 *
 * exec runs `bash -c SCRIPT` in a new session, stdin /dev/null, stdout and stderr on one pipe kept
 * head+tail capped (sandboxes/output.py's format); a deadline (partial output kept, a marker
 * appended), the pids watchdog of sandboxes/process.py (a command that keeps the sandbox at its
 * pids limit is killed within seconds). When the command's main process exits, everything else is
 * killed: as pid 1 of its pid namespace, the server's kill(-1, SIGKILL) reaches every other
 * process of it (a fork racing with it is aborted by the kernel), then all are reaped. Nothing a
 * command starts survives it.
 */
#ifndef PATCHGYM_COMMAND_SERVER_H
#define PATCHGYM_COMMAND_SERVER_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/msg.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <sys/sendfile.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQUEST ((uint32_t)1 << 31)
#define MAX_FIELDS 8
#define DRAIN_GRACE 2.0 /* seconds to drain the pipe after a kill */
#define WORKSPACE "/testbed"
#define MAX_FILE ((1U << 31) - 4096) /* what one answer can carry */
#define MAX_DEPTH 256                /* directories deeper than this are not copied or given away */
#define MAX_LINKS 40                 /* symlinks followed while resolving one path (the kernel's MAXSYMLINKS) */

/* Who owns what a write creates in the workspace (docker: the command user); -1: the server. */
static int workspace_owner = -1;

static char pids_cgroup[256] = "/sys/fs/cgroup/pids"; /* where the pids watchdog reads */

/* ---------------------------------------------------------------------------------------------- */
/* small helpers */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_for(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* 1: read n bytes; 0: end of file before the first byte; -1: error or end of file inside. */
static int read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) return got == 0 ? 0 : -1;
        got += (size_t)r;
    }
    return 1;
}

/* Big buffers come straight from mmap, so that their pages go back to the kernel when freed: an
 * idle server keeps nothing of the last command's output. */
static void *big_alloc(size_t n) {
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void big_free(void *p, size_t n) {
    if (p) munmap(p, n ? n : 1);
}

/* ---------------------------------------------------------------------------------------------- */
/* answers: u32 length, then a status byte ('0' ok, 'E' error) and fields (u32 length + bytes) */

struct field {
    const char *data;
    uint32_t len;
};

static void put_u32(unsigned char *b, uint32_t v) {
    b[0] = v >> 24;
    b[1] = v >> 16;
    b[2] = v >> 8;
    b[3] = v;
}

static uint32_t get_u32(const unsigned char *b) {
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

/* Write all of iov (one writev per call where the pipe takes it: one frame for the engine to pass). */
static int writev_all(int fd, struct iovec *iov, int count) {
    while (count > 0) {
        ssize_t n = writev(fd, iov, count > IOV_MAX ? IOV_MAX : count);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (count > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            count--;
        }
        if (count > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* Several parts may make up one field (the head and tail of the output): parts[i] goes into
 * field owner[i] (owners in order). */
static void respond_parts(char status, int nfields, const struct field *parts, const int *owner, int nparts) {
    uint32_t sizes[MAX_FIELDS] = {0};
    uint64_t total = 1 + 4 * (uint64_t)nfields;
    for (int i = 0; i < nparts; i++) {
        sizes[owner[i]] += parts[i].len;
        total += parts[i].len;
    }
    unsigned char head[5], lens[MAX_FIELDS][4];
    struct iovec iov[1 + MAX_FIELDS * 3];
    int count = 0;
    put_u32(head, (uint32_t)total);
    head[4] = (unsigned char)status;
    iov[count++] = (struct iovec){head, 5};
    int part = 0;
    for (int f = 0; f < nfields; f++) {
        put_u32(lens[f], sizes[f]);
        iov[count++] = (struct iovec){lens[f], 4};
        for (; part < nparts && owner[part] == f; part++)
            if (parts[part].len) iov[count++] = (struct iovec){(void *)parts[part].data, parts[part].len};
    }
    if (writev_all(1, iov, count) < 0) _exit(0); /* the host is gone */
}

static void respond(char status, int nfields, const struct field *fields) {
    int owner[MAX_FIELDS];
    for (int i = 0; i < nfields; i++) owner[i] = i;
    respond_parts(status, nfields, fields, owner, nfields);
}

static struct field str_field(const char *s) {
    struct field f = {s, (uint32_t)strlen(s)};
    return f;
}

static void respond_ok_strings(int n, ...) {
    struct field fields[MAX_FIELDS];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) fields[i] = str_field(va_arg(ap, const char *));
    va_end(ap);
    respond('0', n, fields);
}

/* kind: outside | notfound | notregular | workspace | internal (see sandbox.py) */
static void respond_error(const char *kind, const char *fmt, ...) {
    char message[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    struct field fields[2] = {str_field(kind), str_field(message)};
    respond('E', 2, fields);
}

/* ---------------------------------------------------------------------------------------------- */
/* processes */

static int main_done;
static int main_status;
static pid_t main_pid;

/* Reap every child that has ended (orphans come to pid 1); note the command's main process. */
static void reap_ended(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid == main_pid) {
            main_done = 1;
            main_status = status;
        }
    }
}

static int process_exiting(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 1;
    char state;
    unsigned long flags = 0;
    /* ") S ppid pgrp session tty tpgid flags" */
    if (sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2) return 1;
    return state == 'Z' || state == 'X' || (flags & 0x4); /* PF_EXITING */
}

/* SIGKILL every process of the namespace but this one. The main process, when it is already on
 * its way out, is let finish first so that its own exit status stands. */
static void kill_all(void) {
    if (main_pid > 0 && !main_done && process_exiting(main_pid)) {
        for (int i = 0; i < 1000 && !main_done; i++) {
            reap_ended();
            if (!main_done) sleep_for(0.001);
        }
    }
    kill(-1, SIGKILL);
}

/* Kill and reap until no other process is left; 0 when some could not be reaped in time. */
static int reap_all(double timeout) {
    double deadline = now() + timeout;
    double pause = 0.0002;
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == ECHILD) return 1;
        if (pid == main_pid && pid > 0) {
            main_done = 1;
            main_status = status;
        }
        if (pid > 0) continue;
        if (now() > deadline) return 0;
        kill_all();
        sleep_for(pause);
        if (pause < 0.01) pause *= 2;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the pids watchdog: the same rule as sandboxes/process.py's ProcessLimitWatch */

struct watch {
    int started, have_limit, have_since;
    long limit, failures;
    double since, last_hit, next_poll;
};

static int read_long(const char *path, long *out) {
    char buf[64];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (errno || end == buf || (*end && *end != '\n')) return -1;
    *out = v;
    return 0;
}

static long failed_forks(void) {
    char path[320], buf[256];
    snprintf(path, sizeof path, "%s/pids.events", pids_cgroup);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (strncmp(line, "max ", 4) == 0) return strtol(line + 4, NULL, 10);
    return 0;
}

#define WATCH_HOLD 2.0
#define WATCH_POLL 0.1
#define WATCH_GAP 0.5

/* NULL, or why the command must be killed now (into reason). */
static const char *watch_check(struct watch *w, char *reason, size_t size) {
    double t = now();
    if (t < w->next_poll) return NULL;
    w->next_poll = t + WATCH_POLL;
    char path[320];
    if (!w->started) {
        w->started = 1;
        snprintf(path, sizeof path, "%s/pids.max", pids_cgroup);
        w->have_limit = read_long(path, &w->limit) == 0; /* "max": unlimited, nothing to watch */
        w->failures = failed_forks();
        return NULL;
    }
    if (!w->have_limit) return NULL;
    long failures = failed_forks();
    int failing = failures > w->failures;
    w->failures = failures;
    long current = 0;
    snprintf(path, sizeof path, "%s/pids.current", pids_cgroup);
    if (read_long(path, &current) != 0) current = 0;
    int at_limit = current >= w->limit;
    if (failing || (at_limit && w->have_since)) {
        if (!w->have_since || t - w->last_hit > WATCH_GAP) {
            w->have_since = failing;
            w->since = t;
        }
        w->last_hit = t;
    } else if (w->have_since && t - w->last_hit > WATCH_GAP) {
        w->have_since = 0;
    }
    if (w->have_since && t - w->since >= WATCH_HOLD) {
        snprintf(reason, size, "process limit (%ld) reached", w->limit);
        return reason;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* capped output: the first half and the last half of the limit (sandboxes/output.py) */

struct capped {
    char *buf; /* head: buf[0, head_limit); tail ring: buf[head_limit, limit) */
    size_t limit, head_limit, tail_limit, head_len, tail_len, tail_start;
    uint64_t total;
};

static void capped_feed(struct capped *c, const char *p, size_t n) {
    c->total += n;
    size_t room = c->head_limit - c->head_len;
    if (room > 0) {
        size_t take = n < room ? n : room;
        memcpy(c->buf + c->head_len, p, take);
        c->head_len += take;
        p += take;
        n -= take;
    }
    if (n == 0 || c->tail_limit == 0) return;
    if (n >= c->tail_limit) { /* only the last tail_limit bytes of this chunk can stay */
        memcpy(c->buf + c->head_limit, p + n - c->tail_limit, c->tail_limit);
        c->tail_start = 0;
        c->tail_len = c->tail_limit;
        return;
    }
    /* a ring whose oldest byte is at tail_start; n < tail_limit here */
    char *ring = c->buf + c->head_limit;
    size_t end = (c->tail_start + c->tail_len) % c->tail_limit;
    size_t first = n < c->tail_limit - end ? n : c->tail_limit - end;
    memcpy(ring + end, p, first);
    memcpy(ring, p + first, n - first);
    size_t len = c->tail_len + n;
    if (len > c->tail_limit) {
        c->tail_start = (c->tail_start + len - c->tail_limit) % c->tail_limit;
        len = c->tail_limit;
    }
    c->tail_len = len;
}

/* The tail in order, as at most two parts. */
static int capped_tail(const struct capped *c, struct field *parts) {
    const char *ring = c->buf + c->head_limit;
    size_t first = c->tail_limit - c->tail_start;
    if (c->tail_len <= first) {
        parts[0].data = ring + c->tail_start;
        parts[0].len = (uint32_t)c->tail_len;
        return 1;
    }
    parts[0].data = ring + c->tail_start;
    parts[0].len = (uint32_t)first;
    parts[1].data = ring;
    parts[1].len = (uint32_t)(c->tail_len - first);
    return 2;
}

/* ---------------------------------------------------------------------------------------------- */
/* exec */

extern char **environ;

/* How a server runs a command: its shell, the entries that replace the server's own environment
 * before the request's, what the child does last before the shell (0: go on), and what the server
 * does once the command is over (remove what it could leave without a process). */
struct exec_config {
    const char *bash;
    const char *const *fixed_env; /* NULL-terminated */
    int (*enter)(void);           /* NULL: nothing */
    void (*after)(void);          /* once every process of the command is reaped, before the answer */
};

static char **command_environ(const struct field *env, const char *const *fixed) {
    /* the server's environment, the fixed entries (the command user's identity), then the request's */
    size_t n = 0, nfixed = 0;
    while (environ[n]) n++;
    while (fixed && fixed[nfixed]) nfixed++;
    size_t extra = nfixed;
    for (uint32_t i = 0; i < env->len; i++)
        if (env->data[i] == 0) extra++;
    char **out = calloc(n + extra + 1, sizeof *out);
    if (!out) return NULL;
    size_t count = 0;
    const char *add[4096];
    size_t nadd = 0;
    for (size_t i = 0; i < nfixed; i++) add[nadd++] = fixed[i];
    for (uint32_t i = 0; i < env->len && nadd < 4096;) { /* "K=V\0K=V\0..." */
        const char *entry = env->data + i;
        size_t len = strnlen(entry, env->len - i);
        if (len < env->len - i && strchr(entry, '=')) add[nadd++] = entry;
        i += len + 1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t keylen = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int replaced = 0;
        for (size_t j = 0; j < nadd && !replaced; j++)
            replaced = strncmp(add[j], environ[i], keylen) == 0 && add[j][keylen] == '=';
        if (!replaced) out[count++] = environ[i];
    }
    for (size_t j = 0; j < nadd; j++) { /* a later duplicate key wins */
        size_t keylen = strchr(add[j], '=') - add[j];
        int later = 0;
        for (size_t k = j + 1; k < nadd && !later; k++) later = strncmp(add[k], add[j], keylen + 1) == 0;
        if (!later) out[count++] = (char *)add[j];
    }
    out[count] = NULL;
    return out;
}

static void child_exec(int out_fd, const char *script, char **envp, const struct exec_config *cfg) {
    setsid();
    sigset_t none;
    sigemptyset(&none);
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int null = open("/dev/null", O_RDONLY);
    if (null < 0 || dup2(null, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0) _exit(126);
    syscall(SYS_close_range, 3U, ~0U, 0U);
    /* the OOM killer takes a command before the server */
    int adj = open("/proc/self/oom_score_adj", O_WRONLY);
    if (adj >= 0) {
        (void)!write(adj, "1000", 4);
        close(adj);
    }
    if (chdir("/") != 0) _exit(126);
    if (cfg->enter && cfg->enter() != 0) _exit(126);
    char *argv[] = {"bash", "-c", (char *)script, NULL};
    execve(cfg->bash, argv, envp);
    _exit(127);
}

static void do_exec(const struct field *f, const struct exec_config *cfg) {
    /* fields: script, timeout seconds, output limit, environment ("K=V\0...") */
    if (memchr(f[0].data, 0, f[0].len)) { /* as Python's subprocess would refuse it */
        respond_error("internal", "ValueError: embedded null byte");
        return;
    }
    char number[64];
    snprintf(number, sizeof number, "%.*s", (int)(f[1].len < 63 ? f[1].len : 63), f[1].data);
    double timeout = strtod(number, NULL);
    snprintf(number, sizeof number, "%.*s", (int)(f[2].len < 63 ? f[2].len : 63), f[2].data);
    long long limit = strtoll(number, NULL, 10);
    if (limit < 2 || limit > (1LL << 31)) {
        respond_error("internal", "output limit must be at least 2 bytes and at most 2 GiB");
        return;
    }
    char *script = malloc(f[0].len + 1);
    char **envp = command_environ(&f[3], cfg->fixed_env);
    struct capped out = {0};
    out.limit = (size_t)limit;
    out.head_limit = out.limit / 2;
    out.tail_limit = out.limit - out.head_limit;
    out.buf = big_alloc(out.limit);
    int pipefd[2] = {-1, -1};
    if (!script || !envp || !out.buf || pipe2(pipefd, O_CLOEXEC) != 0) {
        respond_error("internal", "cannot start the command: %s", strerror(errno));
        goto done;
    }
    memcpy(script, f[0].data, f[0].len);
    script[f[0].len] = 0;

    struct rusage before, after;
    getrusage(RUSAGE_CHILDREN, &before);
    double start = now();
    main_done = 0;
    main_status = 0;
    main_pid = fork();
    if (main_pid < 0) {
        respond_error("internal", "fork: %s", strerror(errno));
        main_pid = 0;
        goto done;
    }
    if (main_pid == 0) child_exec(pipefd[1], script, envp, cfg);
    close(pipefd[1]);
    pipefd[1] = -1;
    int fd = pipefd[0];
    fcntl(fd, F_SETFL, O_NONBLOCK);

    struct watch watch = {0};
    watch.next_poll = start + WATCH_POLL;
    double deadline = start + timeout;
    int timed_out = 0, killed_after_exit = 0;
    const char *killed = NULL;
    char reason[128];
    static char chunk[1 << 16];
    for (;;) {
        double t = now();
        if (!timed_out && !killed) {
            if (t >= deadline)
                timed_out = 1;
            else
                killed = watch_check(&watch, reason, sizeof reason);
            if (timed_out || killed) {
                kill_all();
                deadline = t + DRAIN_GRACE; /* leftovers may still hold the pipe */
            }
        } else if (t >= deadline) {
            break;
        }
        reap_ended();
        if (main_done && !killed_after_exit) { /* the main process is gone: end what it left */
            killed_after_exit = 1;
            kill_all();
        }
        double wait = deadline - now();
        if (wait > 0.05) wait = 0.05;
        if (wait < 0) wait = 0;
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = poll(&pfd, 1, (int)(wait * 1000 + 0.999));
        if (ready <= 0) continue;
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) {
            /* End of output. A command that closed its output may still be running (coreutils
             * close stdout before they exit): it ends when its main process does. */
            double pause = 0.0002;
            while (!main_done && !timed_out && !killed) {
                if (now() >= deadline)
                    timed_out = 1;
                else
                    killed = watch_check(&watch, reason, sizeof reason);
                if (timed_out || killed) break;
                sleep_for(pause);
                if (pause < 0.05) pause *= 2;
                reap_ended();
            }
            break;
        }
        capped_feed(&out, chunk, (size_t)n);
    }
    close(fd);
    pipefd[0] = -1;
    kill_all(); /* whatever is left, whether or not the main process has ended */
    int reaped = reap_all(5.0);
    if (reaped && cfg->after) cfg->after();
    double duration = now() - start;
    getrusage(RUSAGE_CHILDREN, &after);
    if (timed_out) {
        char marker[128];
        int len = snprintf(marker, sizeof marker, "\n[patchgym: command timed out after %gs and was killed]\n", timeout);
        capped_feed(&out, marker, (size_t)len);
    } else if (killed) {
        char marker[192];
        int len = snprintf(marker, sizeof marker, "\n[patchgym: command killed: %s]\n", killed);
        capped_feed(&out, marker, (size_t)len);
    }
    if (!reaped) {
        respond_error("internal", "processes of the command could not be killed");
        goto done;
    }
    int exit_code;
    if (timed_out || killed)
        exit_code = -SIGKILL;
    else if (WIFEXITED(main_status))
        exit_code = WEXITSTATUS(main_status);
    else if (WIFSIGNALED(main_status))
        exit_code = -WTERMSIG(main_status);
    else
        exit_code = -1;
    double cpu = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) + (after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
                 ((after.ru_utime.tv_usec - before.ru_utime.tv_usec) + (after.ru_stime.tv_usec - before.ru_stime.tv_usec)) / 1e6;
    char code_s[32], timed_s[4], duration_s[48], total_s[32], cpu_s[48];
    snprintf(code_s, sizeof code_s, "%d", exit_code);
    snprintf(timed_s, sizeof timed_s, "%d", timed_out);
    snprintf(duration_s, sizeof duration_s, "%.6f", duration);
    snprintf(total_s, sizeof total_s, "%llu", (unsigned long long)out.total);
    snprintf(cpu_s, sizeof cpu_s, "%.6f", cpu);
    /* fields: exit code, timed out, duration, total bytes, cpu seconds, head, tail */
    struct field parts[8] = {str_field(code_s), str_field(timed_s), str_field(duration_s), str_field(total_s),
                             str_field(cpu_s), {out.buf, (uint32_t)out.head_len}};
    int owner[8] = {0, 1, 2, 3, 4, 5, 6, 6};
    int ntail = capped_tail(&out, &parts[6]);
    respond_parts('0', 7, parts, owner, 6 + ntail);
done:
    main_pid = 0;
    if (pipefd[0] >= 0) close(pipefd[0]);
    if (pipefd[1] >= 0) close(pipefd[1]);
    free(script);
    free(envp);
    big_free(out.buf, out.limit);
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
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

/* An errno from opening or creating a workspace file, as the Python server classified it. */
static void respond_errno(int err, const char *path) {
    if (err == ENOENT)
        respond_error("notfound", "[Errno 2] No such file or directory: '%s'", path);
    else if (err == ELOOP)
        respond_error("outside", "%s is a symbolic link", path);
    else if (err == EISDIR || err == ENXIO)
        respond_error("notregular", "%s is not a regular file", path);
    else if (err == ENOTDIR || err == EEXIST)
        respond_error("notdir", "[Errno %d] %s: '%s'", err, strerror(err), path);
    else /* the workspace's state (permissions, a full disk): the agent's, never the sandbox's failure */
        respond_error("oserror", "[Errno %d] %s: '%s'", err, strerror(err), path);
}

/* ---------------------------------------------------------------------------------------------- */
/* workspace paths: sandboxes/files.py's rules */

/* Append the components of rest to path (an absolute path, PATH_MAX bytes), resolving symlinks
 * as os.path.realpath(strict=False) does: a missing component is kept as it is and the rest is
 * appended; ".." is lexical on the path resolved so far. -1 on a symlink loop or a long path. */
static int join_real(char *path, const char *rest, int *links) {
    char buf[PATH_MAX];
    if (strlen(rest) >= sizeof buf) return -1;
    strcpy(buf, rest);
    if (buf[0] == '/') strcpy(path, "/");
    char *save = NULL;
    for (char *name = strtok_r(buf, "/", &save); name; name = strtok_r(NULL, "/", &save)) {
        if (strcmp(name, ".") == 0) continue;
        if (strcmp(name, "..") == 0) {
            char *slash = strrchr(path, '/');
            if (slash == path)
                path[1] = 0;
            else if (slash)
                *slash = 0;
            continue;
        }
        size_t len = strlen(path);
        if (len + 1 + strlen(name) >= PATH_MAX) return -1;
        char saved[PATH_MAX];
        strcpy(saved, path);
        if (len > 1) path[len++] = '/';
        strcpy(path + len, name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) continue;
        if (++*links > MAX_LINKS) return -1;
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n < 0) return -1;
        target[n] = 0;
        strcpy(path, saved);
        if (join_real(path, target, links) != 0) return -1;
    }
    return 0;
}

/* The real path of a workspace path (relative, or absolute under /testbed) into out; NULL and an
 * answer sent when it is outside. */
static char *resolve_in_workspace(const char *given, char *out) {
    const char *rel = given;
    if (given[0] == '/') {
        size_t n = strlen(WORKSPACE);
        if (strncmp(given, WORKSPACE, n) != 0 || (given[n] != 0 && given[n] != '/')) {
            respond_error("outside", "%s is outside the workspace", given);
            return NULL;
        }
        rel = given + n;
    }
    while (*rel == '/') rel++;
    strcpy(out, WORKSPACE);
    int links = 0;
    if (join_real(out, rel, &links) != 0) {
        respond_error("outside", "%s: too many levels of symbolic links, or too long", given);
        return NULL;
    }
    size_t n = strlen(WORKSPACE);
    if (strncmp(out, WORKSPACE, n) != 0 || (out[n] != 0 && out[n] != '/')) {
        respond_error("outside", "%s resolves outside the workspace", given);
        return NULL;
    }
    return out;
}

static int field_string(const struct field *f, char *out, size_t size, const char *what) {
    if (f->len >= size || memchr(f->data, 0, f->len)) {
        respond_error("internal", "invalid %s", what);
        return -1;
    }
    memcpy(out, f->data, f->len);
    out[f->len] = 0;
    return 0;
}

/* Open a file of the workspace as a regular file only: never through a symlink (O_NOFOLLOW), never
 * blocking on a FIFO (O_NONBLOCK). On failure the request is answered here and -1 returned. */
static int open_regular(const char *path, int flags, struct stat *st) {
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
        respond_errno(errno, path);
        return -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        respond_error("notregular", "%s is not a regular file", path);
        return -1;
    }
    return fd;
}

static void do_read(const struct field *f) {
    char given[PATH_MAX], path[PATH_MAX];
    if (field_string(&f[0], given, sizeof given, "path") != 0 || !resolve_in_workspace(given, path)) return;
    struct stat st;
    int fd = open_regular(path, O_RDONLY, &st);
    if (fd < 0) return;
    if (st.st_size > MAX_FILE) {
        close(fd);
        respond_error("internal", "%s is larger than %u bytes: too large to read through the sandbox", path, MAX_FILE);
        return;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *data = big_alloc(size);
    if (!data) {
        close(fd);
        respond_error("internal", "%s: cannot allocate %zu bytes", path, size);
        return;
    }
    while (got < size) {
        ssize_t n = read(fd, data + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    struct field field = {data, (uint32_t)got};
    respond('0', 1, &field);
    big_free(data, size);
}

/* Give path (a file, or a tree) to the workspace's owner, symlinks included but never followed. */
static void give_tree(int dirfd, const char *name, int depth) {
    if (fchownat(dirfd, name, workspace_owner, workspace_owner, AT_SYMLINK_NOFOLLOW) != 0 || depth > MAX_DEPTH) return;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return;
    }
    struct dirent *entry;
    while ((entry = readdir(dir)))
        if (strcmp(entry->d_name, ".") && strcmp(entry->d_name, ".."))
            give_tree(fd, entry->d_name, depth + 1);
    closedir(dir);
}

static void do_write(const struct field *f) {
    char given[PATH_MAX], path[PATH_MAX], parent[PATH_MAX], check[PATH_MAX];
    if (field_string(&f[0], given, sizeof given, "path") != 0 || !resolve_in_workspace(given, path)) return;
    if (strcmp(path, WORKSPACE) == 0) { /* its parent is outside the workspace */
        respond_error("outside", "%s is the workspace itself, not a file in it", given);
        return;
    }
    /* the first component of the path that does not exist yet: it and all below go to the owner */
    char first_new[PATH_MAX];
    strcpy(first_new, path);
    for (;;) {
        char up[PATH_MAX];
        strcpy(up, first_new);
        char *slash = strrchr(up, '/');
        if (!slash || slash == up) break;
        *slash = 0;
        struct stat st;
        if (stat(up, &st) == 0) break;
        strcpy(first_new, up);
    }
    strcpy(parent, path);
    *strrchr(parent, '/') = 0;
    for (char *p = parent + 1;; p++) { /* mkdir -p */
        if (*p != '/' && *p != 0) continue;
        char saved = *p;
        *p = 0;
        struct stat st;
        if (mkdir(parent, 0777) != 0 && errno != EEXIST) {
            int err = errno;
            *p = saved;
            respond_errno(err, parent);
            return;
        }
        if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
            *p = saved;
            respond_error("notdir", "[Errno 17] File exists: '%s'", parent);
            return;
        }
        *p = saved;
        if (saved == 0) break;
    }
    if (!resolve_in_workspace(parent, check)) return; /* mkdir must not have crossed a symlink */
    struct stat st;
    int fd = open_regular(path, O_WRONLY | O_CREAT | O_TRUNC, &st);
    if (fd < 0) return;
    fcntl(fd, F_SETFL, 0);
    if (write_all(fd, f[1].data, f[1].len) != 0) {
        int err = errno;
        close(fd);
        respond_error("oserror", "[Errno %d] writing %s: %s", err, path, strerror(err));
        return;
    }
    close(fd);
    if (workspace_owner >= 0) give_tree(AT_FDCWD, first_new, 0);
    respond('0', 0, NULL);
}

/* ---------------------------------------------------------------------------------------------- */
/* emptying a directory (no descent past 64 levels: deeper subtrees are moved up and emptied later) */

static void remove_contents(int dirfd, int depth, int topfd, unsigned *trash);

static void remove_entry(int dirfd, const char *name, int depth, int topfd, unsigned *trash) {
    if (unlinkat(dirfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM)) return;
    if (depth >= 64) { /* bounded descent: move a deep subtree to the top, emptied on a later pass */
        char moved[64];
        snprintf(moved, sizeof moved, ".patchgym-trash-%u", (*trash)++);
        renameat(dirfd, name, topfd, moved);
        return;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    remove_contents(fd, depth + 1, topfd, trash);
    close(fd);
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

static void remove_contents(int dirfd, int depth, int topfd, unsigned *trash) {
    int fd = dup(dirfd);
    if (fd < 0) return;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return;
    }
    struct dirent *entry;
    while ((entry = readdir(dir)))
        if (strcmp(entry->d_name, ".") && strcmp(entry->d_name, ".."))
            remove_entry(dirfd, entry->d_name, depth, topfd, trash);
    closedir(dir);
}

static int dir_empty(int dirfd) {
    int fd = dup(dirfd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0) close(fd);
        return 1;
    }
    struct dirent *entry;
    int empty = 1;
    while (empty && (entry = readdir(dir))) empty = !strcmp(entry->d_name, ".") || !strcmp(entry->d_name, "..");
    closedir(dir);
    return empty;
}

static void clear_directory(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    unsigned trash = 0;
    for (int pass = 0; pass < 100 && !dir_empty(fd); pass++) {
        lseek(fd, 0, SEEK_SET);
        remove_contents(fd, 0, fd, &trash);
    }
    close(fd);
}

/* Remove every System V IPC object of the IPC namespace: commands made them, and only their owner
 * may remove them (a server has no CAP_SYS_ADMIN), so a child that enter()s the command user's
 * identity does. Without this a segment or queue made by one command was there for the next. */
static void clear_sysv_ipc(int (*enter)(void)) {
    static const char *KINDS[] = {"/proc/sysvipc/shm", "/proc/sysvipc/msg", "/proc/sysvipc/sem"};
    pid_t pid = fork();
    if (pid < 0) return;
    if (pid == 0) {
        if (enter && enter() != 0) _exit(1);
        for (int k = 0; k < 3; k++) {
            FILE *fh = fopen(KINDS[k], "r");
            if (!fh) continue;
            char line[512];
            int id;
            if (fgets(line, sizeof line, fh)) /* the header */
                while (fgets(line, sizeof line, fh))
                    if (sscanf(line, "%*d %d", &id) == 1) {
                        if (k == 0) shmctl(id, IPC_RMID, NULL);
                        else if (k == 1) msgctl(id, IPC_RMID, NULL);
                        else semctl(id, 0, IPC_RMID);
                    }
            fclose(fh);
        }
        _exit(0);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
}

/* ---------------------------------------------------------------------------------------------- */
/* the request loop */

static char server_pid[16];

/* The greeting the host waits for: "ready" and this server's pid. */
static void greet(void) {
    snprintf(server_pid, sizeof server_pid, "%d", (int)getpid());
    respond_ok_strings(2, "ready", server_pid);
}

static void do_ping(const struct field *f) {
    (void)f;
    respond_ok_strings(1, server_pid);
}

struct op {
    char code;
    int fields;                         /* how many the request must carry */
    void (*run)(const struct field *f); /* answers with respond...() */
};

/* Answer requests read from stdin with ops (terminated by code 0) until stdin closes: 0 then, 1 on a
 * malformed stream. */
static int serve(const struct op *ops) {
    for (;;) {
        unsigned char head[4];
        int got = read_all(0, head, 4);
        if (got == 0) return 0; /* the host closed the stream: nobody can use this sandbox any more */
        if (got < 0) return 1;
        uint32_t size = get_u32(head);
        if (size < 1 || size > MAX_REQUEST) {
            fprintf(stderr, "bad request size %u\n", size);
            return 1;
        }
        unsigned char *body = big_alloc(size);
        if (!body || read_all(0, body, size) != 1) return 1;
        struct field fields[MAX_FIELDS] = {{0}};
        int nfields = 0;
        uint32_t at = 1;
        while (at < size && nfields < MAX_FIELDS) {
            if (size - at < 4) break;
            uint32_t len = get_u32(body + at);
            at += 4;
            if (len > size - at) break;
            fields[nfields].data = (const char *)body + at;
            fields[nfields].len = len;
            nfields++;
            at += len;
        }
        char code = (char)body[0];
        const struct op *op = ops;
        while (op->code && op->code != code) op++;
        if (!op->code)
            respond_error("internal", "unknown op %c", code);
        else if (at != size || nfields != op->fields)
            respond_error("internal", "malformed request (op %c, %d fields)", code, nfields);
        else
            op->run(fields);
        big_free(body, size);
    }
}

#endif
