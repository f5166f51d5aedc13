/*
 * patchgym's in-container command server for the Docker backend: the container's main process.
 *
 * Why C: an idle sandbox should cost the host next to nothing. This server is the container's
 * pid 1 (no docker-init, no `sleep`), a static binary of a few hundred KiB of which an idle
 * process touches about 100 KiB, where the Python server it replaces held about 10 MiB. It is
 * built once per engine from this file (see runtime.py) and mounted read-only into every sandbox.
 *
 * The host talks to it over the container's own stdin and stdout (one attached Docker stream, no
 * `docker exec`): requests and answers are length-prefixed binary messages (see connection.py).
 *
 *   exec   runs `bash -c SCRIPT` as uid 1000 in a new session, stdin /dev/null, stdout and stderr
 *          on one pipe kept head+tail capped (the same format as sandboxes/output.py); a deadline
 *          (partial output kept, a marker appended), the pids watchdog of sandboxes/process.py
 *          (a command that keeps the container at its pids limit is killed within seconds).
 *          When the command's main process exits, everything else is killed: as pid 1 of the
 *          container's pid namespace, kill(-1, SIGKILL) reaches every other process of it (a fork
 *          racing with it is aborted by the kernel), then all are reaped. Nothing a command starts
 *          survives it. A command that closed its output ends when its main process exits.
 *   read / write   a file of the workspace: the path must resolve inside /testbed (symlinks
 *          followed as Python's os.path.realpath does, then checked), its last component may not
 *          be a symlink (O_NOFOLLOW), only regular files are opened (O_NONBLOCK: a FIFO never
 *          blocks the server). Written files and the directories made for them go to uid 1000.
 *   reset  kills every process, removes System V IPC objects, empties /testbed and the scratch
 *          directories, and fills /testbed again from the pristine tree the instance image keeps
 *          (root's only) at /var/lib/patchgym/testbed, as uid 1000's; the stat of every file copied
 *          is recorded for the diff (a file whose stat is unchanged is not read again).
 *   diff   runs the Python diff helper (diff_helper.py, sandboxes/gitops.py) as root, on demand.
 *   usage  the container's CPU time and peak memory, from its cgroups.
 *   ping   answers with its pid.
 *
 * Commands run as uid 1000 who owns /testbed: they cannot signal or trace this process (root,
 * non-dumpable, and pid 1 of the namespace ignores signals it has no handler for), nor write its
 * binary (a read-only mount, root's) or the pristine tree. The server ends itself when its
 * lifetime is over or when the host's stream closes (the engine then removes the container).
 */
#define _GNU_SOURCE
#include "command_server.h"

#define STATE_DIR "/var/lib/patchgym"
#define PRISTINE STATE_DIR "/testbed"
#define STATS_FILE STATE_DIR "/stats"
#define DIFF_OUT STATE_DIR "/diff.out"
#define DIFF_ERR STATE_DIR "/diff.err"
#define RUNTIME_DIR "/opt/patchgym"
#define DIFF_HELPER RUNTIME_DIR "/diff_helper.py"
#define PYTHON "/usr/bin/python3"
#define AGENT_UID 1000

static const char *SCRATCH[] = {"/tmp", "/var/tmp", "/dev/shm", "/run/lock", NULL};

/* Commands run as uid 1000, with no supplementary groups. */
static int become_agent(void) {
    return setgroups(0, NULL) != 0 || setresgid(AGENT_UID, AGENT_UID, AGENT_UID) != 0 ||
           setresuid(AGENT_UID, AGENT_UID, AGENT_UID) != 0;
}

static const char *const AGENT_ENV[] = {"HOME=/tmp", "USER=agent", "LOGNAME=agent", NULL};
static const struct exec_config AGENT = {"/bin/bash", AGENT_ENV, become_agent, NULL};

static void do_exec_agent(const struct field *f) {
    do_exec(f, &AGENT);
}

/* ---------------------------------------------------------------------------------------------- */
/* reset: empty directories, copy the pristine tree */

struct copy_state {
    FILE *stats;
    char rel[PATH_MAX]; /* the path being copied, relative to the tree's top */
    int error;
};

/* The repository's objects are not copied: /testbed/.git/objects borrows them from the pristine
 * tree through git's alternates (read-only: root's files in the image, shared by every sandbox of
 * the image in the page cache), and holds only the objects the agent's own git commands write.
 * Most of a repository's bytes are its history: a copy would hold them in each sandbox's memory. */
static int share_objects(int to, const char *name, const struct stat *st) {
    static const char alternates[] = PRISTINE "/.git/objects\n";
    if (mkdirat(to, name, 0700) != 0 && errno != EEXIST) return -1;
    int fd = openat(to, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    int ok = (mkdirat(fd, "info", 0755) == 0 || errno == EEXIST) && (mkdirat(fd, "pack", 0755) == 0 || errno == EEXIST);
    int file = ok ? openat(fd, "info/alternates", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
    ok = file >= 0 && write_all(file, alternates, sizeof alternates - 1) == 0 && fchown(file, AGENT_UID, AGENT_UID) == 0;
    if (file >= 0) close(file);
    struct timespec times[2] = {st->st_atim, st->st_mtim};
    ok = ok && fchownat(fd, "info", AGENT_UID, AGENT_UID, AT_SYMLINK_NOFOLLOW) == 0 &&
         fchownat(fd, "pack", AGENT_UID, AGENT_UID, AT_SYMLINK_NOFOLLOW) == 0 && fchown(fd, AGENT_UID, AGENT_UID) == 0 &&
         fchmod(fd, st->st_mode & 07777) == 0 && futimens(fd, times) == 0;
    close(fd);
    return ok ? 0 : -1;
}

static void record(struct copy_state *s, const struct stat *st) {
    if (strncmp(s->rel, ".git/", 5) == 0) return; /* the diff never looks into .git */
    /* path\0, then ino, mode, size, mtime_ns, ctime_ns as little-endian int64 (gitops.stat_key) */
    int64_t v[5] = {(int64_t)st->st_ino, (int64_t)st->st_mode, (int64_t)st->st_size,
                    (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec,
                    (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec};
    fwrite(s->rel, 1, strlen(s->rel) + 1, s->stats);
    fwrite(v, sizeof v, 1, s->stats);
}

static int copy_bytes(int from, int to, off_t size) {
    off_t done = 0;
    while (done < size) {
        ssize_t n = sendfile(to, from, NULL, (size_t)(size - done) > (1 << 30) ? (1 << 30) : (size_t)(size - done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n == 0 ? 0 : -1; /* a shorter file: what it has */
        done += n;
    }
    return 0;
}

static void copy_tree(int from, int to, struct copy_state *s, int depth);

static void copy_entry(int from, int to, const char *name, struct copy_state *s, int depth) {
    struct stat st;
    if (fstatat(from, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
    size_t rel_len = strlen(s->rel);
    if (rel_len + strlen(name) + 2 >= sizeof s->rel) {
        s->error = ENAMETOOLONG;
        return;
    }
    if (rel_len) strcat(s->rel, "/");
    strcat(s->rel, name);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    if (S_ISDIR(st.st_mode) && strcmp(s->rel, ".git/objects") == 0) {
        if (share_objects(to, name, &st) != 0) s->error = errno;
    } else if (S_ISDIR(st.st_mode)) {
        if (depth < MAX_DEPTH && (mkdirat(to, name, 0700) == 0 || errno == EEXIST)) {
            int sub_from = openat(from, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            int sub_to = openat(to, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub_from >= 0 && sub_to >= 0) {
                copy_tree(sub_from, sub_to, s, depth + 1);
                if (fchown(sub_to, AGENT_UID, AGENT_UID) != 0 || fchmod(sub_to, st.st_mode & 07777) != 0 ||
                    futimens(sub_to, times) != 0)
                    s->error = errno;
            } else {
                s->error = errno;
            }
            if (sub_from >= 0) close(sub_from);
            if (sub_to >= 0) close(sub_to);
        } else {
            s->error = depth < MAX_DEPTH ? errno : ELOOP;
        }
    } else if (S_ISREG(st.st_mode)) {
        int src = openat(from, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        int dst = openat(to, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
        struct stat done;
        if (src >= 0 && dst >= 0 && fchown(dst, AGENT_UID, AGENT_UID) == 0 && copy_bytes(src, dst, st.st_size) == 0 &&
            fchmod(dst, st.st_mode & 01777) == 0 && futimens(dst, times) == 0 && fstat(dst, &done) == 0)
            record(s, &done);
        else
            s->error = errno;
        if (src >= 0) close(src);
        if (dst >= 0) close(dst);
    } else if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlinkat(from, name, target, sizeof target - 1);
        struct stat done;
        if (n >= 0) {
            target[n] = 0;
            if (symlinkat(target, to, name) != 0 && errno == EEXIST) {
                unlinkat(to, name, 0);
                symlinkat(target, to, name);
            }
            if (fchownat(to, name, AGENT_UID, AGENT_UID, AT_SYMLINK_NOFOLLOW) == 0 &&
                utimensat(to, name, times, AT_SYMLINK_NOFOLLOW) == 0 && fstatat(to, name, &done, AT_SYMLINK_NOFOLLOW) == 0)
                record(s, &done);
            else
                s->error = errno;
        } else {
            s->error = errno;
        }
    }
    s->rel[rel_len] = 0;
}

static void copy_tree(int from, int to, struct copy_state *s, int depth) {
    int fd = dup(from);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0) close(fd);
        s->error = errno;
        return;
    }
    struct dirent *entry;
    while ((entry = readdir(dir)))
        if (strcmp(entry->d_name, ".") && strcmp(entry->d_name, ".."))
            copy_entry(from, to, entry->d_name, s, depth);
    closedir(dir);
}

/* Copy the pristine tree into the (empty) workspace, as the command user's; record the stats. */
static int fill_workspace(char *error, size_t size) {
    struct copy_state s = {0};
    int from = open(PRISTINE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int to = open(WORKSPACE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int stats_fd = open(STATS_FILE ".new", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    s.stats = stats_fd >= 0 ? fdopen(stats_fd, "w") : NULL;
    struct stat st;
    if (from < 0 || to < 0 || !s.stats || fstat(from, &st) != 0) {
        snprintf(error, size, "cannot open %s, %s or %s: %s", PRISTINE, WORKSPACE, STATS_FILE, strerror(errno));
    } else {
        copy_tree(from, to, &s, 0);
        struct timespec times[2] = {st.st_atim, st.st_mtim};
        if (fchown(to, AGENT_UID, AGENT_UID) != 0 || fchmod(to, st.st_mode & 07777) != 0 || futimens(to, times) != 0)
            s.error = errno;
        if (fclose(s.stats) != 0 && !s.error) s.error = errno;
        s.stats = NULL;
        if (!s.error && rename(STATS_FILE ".new", STATS_FILE) != 0) s.error = errno;
        if (s.error) snprintf(error, size, "filling %s from %s: %s", WORKSPACE, PRISTINE, strerror(s.error));
    }
    if (s.stats) fclose(s.stats);
    if (from >= 0) close(from);
    if (to >= 0) close(to);
    return s.error || from < 0 || to < 0 ? -1 : 0;
}

static void do_reset(const struct field *f) {
    (void)f;
    char error[512];
    kill_all();
    if (!reap_all(5.0)) {
        respond_error("internal", "processes could not be killed");
        return;
    }
    clear_sysv_ipc(become_agent);
    clear_directory(WORKSPACE);
    for (int i = 0; SCRATCH[i]; i++) clear_directory(SCRATCH[i]);
    if (fill_workspace(error, sizeof error) != 0)
        respond_error("internal", "%s", error);
    else
        respond('0', 0, NULL);
}

/* ---------------------------------------------------------------------------------------------- */
/* diff: the Python helper, as root, its JSON answer passed on */

static void do_diff(const struct field *f) {
    char limit[32];
    if (field_string(&f[0], limit, sizeof limit, "limit") != 0) return;
    int out = open(DIFF_OUT, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err = open(DIFF_ERR, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0 || err < 0) {
        respond_error("internal", "cannot create the diff's output: %s", strerror(errno));
        goto done;
    }
    pid_t pid = fork();
    if (pid < 0) {
        respond_error("internal", "fork: %s", strerror(errno));
        goto done;
    }
    if (pid == 0) {
        for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
        int null = open("/dev/null", O_RDONLY);
        if (null < 0 || dup2(null, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
        syscall(SYS_close_range, 3U, ~0U, 0U);
        char *argv[] = {PYTHON, "-I", "-S", DIFF_HELPER, limit, NULL};
        execve(PYTHON, argv, environ);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    reap_ended();
    struct stat st;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || fstat(out, &st) != 0) {
        char tail[2001] = "";
        off_t size = lseek(err, 0, SEEK_END);
        off_t from = size > 2000 ? size - 2000 : 0;
        ssize_t n = pread(err, tail, 2000, from);
        tail[n > 0 ? n : 0] = 0;
        respond_error("internal", "the diff helper failed (status %d): %s", status, tail);
        goto done;
    }
    size_t size = (size_t)st.st_size;
    char *data = big_alloc(size);
    ssize_t got = data ? pread(out, data, size, 0) : -1;
    if (got < 0) {
        respond_error("internal", "cannot read the diff: %s", strerror(errno));
    } else {
        struct field field = {data, (uint32_t)got};
        respond('0', 1, &field);
    }
    big_free(data, size);
done:
    if (out >= 0) close(out);
    if (err >= 0) close(err);
    unlink(DIFF_OUT);
    unlink(DIFF_ERR);
}

/* ---------------------------------------------------------------------------------------------- */
/* usage: the container's CPU time (ns) and peak memory (bytes) from its own cgroups, "" if unknown */

static void read_number_at(const char *path, const char *key, char *out, size_t size) {
    char buf[4096];
    out[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    char *at = buf;
    if (key) { /* "key value" lines */
        size_t len = strlen(key);
        for (at = buf; at && strncmp(at, key, len) != 0; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL) {
        }
        if (!at) return;
        at += len;
    }
    unsigned long long value = strtoull(at, NULL, 10);
    snprintf(out, size, "%llu", key ? value * 1000ULL : value); /* v2 reports microseconds */
}

static void do_usage(const struct field *f) {
    (void)f;
    char cpu[32], peak[32];
    read_number_at("/sys/fs/cgroup/cpuacct/cpuacct.usage", NULL, cpu, sizeof cpu);
    if (!cpu[0]) read_number_at("/sys/fs/cgroup/cpu.stat", "usage_usec ", cpu, sizeof cpu);
    read_number_at("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", NULL, peak, sizeof peak);
    if (!peak[0]) read_number_at("/sys/fs/cgroup/memory.peak", NULL, peak, sizeof peak);
    respond_ok_strings(2, cpu, peak);
}

/* ---------------------------------------------------------------------------------------------- */
/* start-up */

static int has_uid(const char *file, unsigned uid) {
    FILE *fh = fopen(file, "re");
    if (!fh) return 0;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, fh)) {
        char *field = strchr(line, ':'); /* name:x:uid: */
        if (field) field = strchr(field + 1, ':');
        if (field && strtoul(field + 1, NULL, 10) == uid && field[1] >= '0' && field[1] <= '9') found = 1;
    }
    fclose(fh);
    return found;
}

static int append_line(const char *file, const char *line) {
    FILE *fh = fopen(file, "ae");
    if (!fh) return -1;
    int ok = fputs(line, fh) >= 0;
    return fclose(fh) == 0 && ok ? 0 : -1;
}

static void on_signal_exit(int sig) {
    (void)sig;
    _exit(0);
}

static void prepare(long lifetime) {
    workspace_owner = AGENT_UID;
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    umask(022);
    /* Free memory goes back to the kernel at once: no trim threshold, no growing mmap threshold. */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 * 1024);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXCPU, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, on_signal_exit);
    signal(SIGALRM, on_signal_exit); /* the end of the lifetime: the engine removes the container */
    if (lifetime > 0) alarm((unsigned)lifetime);
    /* The command user may pass through (not list) the state directory to the pristine tree's
     * objects, which its repository borrows (see share_objects); nothing in it is its to change. */
    chmod(STATE_DIR, 0711);
    if (access("/sys/fs/cgroup/pids/pids.max", F_OK) != 0) strcpy(pids_cgroup, "/sys/fs/cgroup"); /* v2 */
    if (!has_uid("/etc/passwd", AGENT_UID)) append_line("/etc/passwd", "agent:x:1000:1000::/tmp:/bin/bash\n");
    if (!has_uid("/etc/group", AGENT_UID)) append_line("/etc/group", "agent:x:1000:\n");
}

int main(int argc, char **argv) {
    long lifetime = argc > 1 ? strtol(argv[1], NULL, 10) : 0;
    if (getpid() != 1) {
        fprintf(stderr, "patchgym's command server must be the container's main process (pid 1)\n");
        return 2;
    }
    prepare(lifetime);
    char error[512];
    if (fill_workspace(error, sizeof error) != 0) {
        fprintf(stderr, "%s\n", error);
        return 1;
    }
    greet();
    static const struct op OPS[] = {{'X', 4, do_exec_agent}, {'R', 1, do_read}, {'W', 2, do_write},
                                    {'Z', 0, do_reset}, {'D', 1, do_diff}, {'P', 0, do_ping},
                                    {'U', 0, do_usage}, {0, 0, NULL}};
    return serve(OPS);
}
