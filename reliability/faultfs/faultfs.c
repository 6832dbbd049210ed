/* faultfs: an LD_PRELOAD shim that makes the N-th file-system mutation of a
 * process fail, so the reliability tests can check every store's commit path
 * against I/O errors (EIO) and a full disk (ENOSPC) without changing the
 * stores' code.
 *
 * Counted calls: open/open64/openat/openat64 for writing or creating,
 * write, pwrite, pwrite64, writev, ftruncate, ftruncate64, fallocate,
 * fallocate64, fsync, fdatasync, msync, rename, renameat, renameat2. Writes
 * to fds 0-2 (the test's own output) are never counted.
 *
 * Environment:
 *   FAULTFS_AT=N           fail the N-th counted call (0 or unset: never)
 *   FAULTFS_ERRNO=E        EIO (default), ENOSPC, or a number
 *   FAULTFS_STICKY=1       keep failing every counted call after the N-th
 *                          (a disk that stays full)
 *   FAULTFS_COUNT_FILE=P   write the number of counted calls to P at exit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long fault_at = 0;
static int fault_errno = EIO;
static int sticky = 0;
static const char *count_file = NULL;
static atomic_long counter = 0;

__attribute__((constructor)) static void faultfs_init(void) {
    const char *at = getenv("FAULTFS_AT");
    if (at) fault_at = atol(at);
    const char *e = getenv("FAULTFS_ERRNO");
    if (e) {
        if (strcmp(e, "ENOSPC") == 0) fault_errno = ENOSPC;
        else if (strcmp(e, "EIO") == 0) fault_errno = EIO;
        else fault_errno = atoi(e);
    }
    const char *s = getenv("FAULTFS_STICKY");
    sticky = s && strcmp(s, "1") == 0;
    count_file = getenv("FAULTFS_COUNT_FILE");
}

__attribute__((destructor)) static void faultfs_fini(void) {
    if (!count_file) return;
    FILE *f = fopen(count_file, "w");
    if (!f) return;
    fprintf(f, "%ld\n", atomic_load(&counter));
    fclose(f);
}

/* Counts one mutation; returns 1 (with errno set) when it must fail. */
static int faultfs_fail(int fd) {
    if (fd >= 0 && fd <= 2) return 0;
    long n = atomic_fetch_add(&counter, 1) + 1;
    if (fault_at > 0 && (n == fault_at || (sticky && n > fault_at))) {
        errno = fault_errno;
        return 1;
    }
    return 0;
}

#define REAL(name, ret, ...) \
    static ret (*real_##name)(__VA_ARGS__) = NULL; \
    if (!real_##name) real_##name = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

static int writes(int flags) { return flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC); }

#define OPEN_LIKE(name) \
    int name(const char *path, int flags, ...) { \
        mode_t mode = 0; \
        if (flags & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); } \
        REAL(name, int, const char *, int, ...); \
        if (writes(flags) && faultfs_fail(-1)) return -1; \
        return real_##name(path, flags, mode); \
    }
OPEN_LIKE(open)
OPEN_LIKE(open64)

#define OPENAT_LIKE(name) \
    int name(int dirfd, const char *path, int flags, ...) { \
        mode_t mode = 0; \
        if (flags & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); } \
        REAL(name, int, int, const char *, int, ...); \
        if (writes(flags) && faultfs_fail(-1)) return -1; \
        return real_##name(dirfd, path, flags, mode); \
    }
OPENAT_LIKE(openat)
OPENAT_LIKE(openat64)

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write, ssize_t, int, const void *, size_t);
    if (faultfs_fail(fd)) return -1;
    return real_write(fd, buf, n);
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite, ssize_t, int, const void *, size_t, off_t);
    if (faultfs_fail(fd)) return -1;
    return real_pwrite(fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) {
    REAL(pwrite64, ssize_t, int, const void *, size_t, off64_t);
    if (faultfs_fail(fd)) return -1;
    return real_pwrite64(fd, buf, n, off);
}
ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL(writev, ssize_t, int, const struct iovec *, int);
    if (faultfs_fail(fd)) return -1;
    return real_writev(fd, iov, cnt);
}
int ftruncate(int fd, off_t len) {
    REAL(ftruncate, int, int, off_t);
    if (faultfs_fail(fd)) return -1;
    return real_ftruncate(fd, len);
}
int ftruncate64(int fd, off64_t len) {
    REAL(ftruncate64, int, int, off64_t);
    if (faultfs_fail(fd)) return -1;
    return real_ftruncate64(fd, len);
}
int fallocate(int fd, int mode, off_t off, off_t len) {
    REAL(fallocate, int, int, int, off_t, off_t);
    if (faultfs_fail(fd)) return -1;
    return real_fallocate(fd, mode, off, len);
}
int fallocate64(int fd, int mode, off64_t off, off64_t len) {
    REAL(fallocate64, int, int, int, off64_t, off64_t);
    if (faultfs_fail(fd)) return -1;
    return real_fallocate64(fd, mode, off, len);
}
int fsync(int fd) {
    REAL(fsync, int, int);
    if (faultfs_fail(fd)) return -1;
    return real_fsync(fd);
}
int fdatasync(int fd) {
    REAL(fdatasync, int, int);
    if (faultfs_fail(fd)) return -1;
    return real_fdatasync(fd);
}
int msync(void *addr, size_t len, int flags) {
    REAL(msync, int, void *, size_t, int);
    if (faultfs_fail(-1)) return -1;
    return real_msync(addr, len, flags);
}
int rename(const char *from, const char *to) {
    REAL(rename, int, const char *, const char *);
    if (faultfs_fail(-1)) return -1;
    return real_rename(from, to);
}
int renameat(int fd1, const char *from, int fd2, const char *to) {
    REAL(renameat, int, int, const char *, int, const char *);
    if (faultfs_fail(-1)) return -1;
    return real_renameat(fd1, from, fd2, to);
}
int renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags) {
    REAL(renameat2, int, int, const char *, int, const char *, unsigned);
    if (faultfs_fail(-1)) return -1;
    return real_renameat2(fd1, from, fd2, to, flags);
}
