/* write_faults.h: failure injection at the system calls the report writers
 * make (kv_report_file_publish and kv_report_check_writable, reports/report.h),
 * for tests/test_atomic_write.c.
 *
 * The hook is the linker's, not the writer's: the test binary is linked
 * with -Wl,--wrap=open,--wrap=write,... (tests/CMakeLists.txt,
 * KV_WRITE_FAULT_WRAPS), so every call of those functions from an object of
 * that link, libkvreport.a's unchanged report.o included, reaches
 * __wrap_open etc. in write_faults.c, which passes it on to the C library
 * (__real_open) unless a test armed a fault. The writers carry no hook, no
 * test flag and no extra branch; the code under test is the library the
 * kvrepro binary links. HDF5 is a shared library, so its own calls are not
 * seen (the writer builds the file in memory; only the publish touches the
 * disk). A writer that stopped making these calls (pwrite, writev, openat)
 * would not be seen either, which is why every test first checks that the
 * recorded sequence holds the write, the fsync and the rename it expects.
 *
 * Calls are counted from wf_arm; the call with index `at` gets the action. */
#ifndef KV_WRITE_FAULTS_H
#define KV_WRITE_FAULTS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    WF_OPEN,      /* open() without O_TMPFILE: path */
    WF_OPEN_TMP,  /* open(dir, O_TMPFILE): path is the directory */
    WF_WRITE,     /* write(): fd, bytes asked for */
    WF_FSYNC,     /* fsync(): fd */
    WF_CLOSE,     /* close(): fd */
    WF_LINKAT,    /* linkat(): path (the source, "/proc/self/fd/N" or ""), path2 (the new name) */
    WF_RENAME,    /* rename(): path -> path2 */
    WF_UNLINK,    /* unlink(): path */
    WF_UNLINKAT,  /* unlinkat(): path (relative to a directory fd) */
    WF_N_OPS
} WfOp;

typedef enum {
    WF_RECORD,      /* no fault: only record the calls */
    WF_FAIL,        /* the call fails with the armed errno without being made (close is
                     * made: Linux releases the descriptor even when close fails) */
    WF_SHORT_FAIL,  /* write only: half the bytes are written (a short write, which is
                     * allowed), then the next write() fails with the armed errno */
    WF_STOP_BEFORE, /* raise(SIGSTOP) before the call (a parent then kills the writer) */
    WF_STOP_MID,    /* write only: half the bytes written, then raise(SIGSTOP) */
    WF_STOP_AFTER,  /* the call, then raise(SIGSTOP) */
    WF_NOTIFY,      /* only tell (below) before the call, which is then made */
} WfAction;
/* The stops and WF_NOTIFY tell a parent where the writer is: one byte, the
 * call's WfOp, to the descriptor given to wf_arm, before stopping. */

#define WF_PATH_MAX 512
#define WF_MAX_CALLS 64

typedef struct {
    WfOp op;
    int fd;          /* write, fsync, close; the descriptor returned by an open */
    int flags;       /* open */
    size_t len;      /* write */
    long result;     /* the return value (-1: failed, with err) */
    int err;
    char path[WF_PATH_MAX];
    char path2[WF_PATH_MAX];
} WfCall;

/* Starts recording (the trace is emptied) and arms action for the call with
 * index at (-1: none). errnum is the failure's errno (WF_FAIL,
 * WF_SHORT_FAIL); fd is where the stops and WF_NOTIFY tell (-1: nowhere). */
void wf_arm(int at, WfAction action, int errnum, int fd);

/* Stops recording and injecting; the trace stays readable. */
void wf_disarm(void);

/* As on a file system without unnamed files: while on, armed or not,
 * open(O_TMPFILE) fails with EOPNOTSUPP (recorded as a call like any other). */
void wf_set_no_tmpfile(bool on);

/* Whether the armed call was reached since wf_arm. */
bool wf_fired(void);

/* The calls recorded since wf_arm (at most WF_MAX_CALLS; wf_overflow says
 * whether more were made). */
const WfCall *wf_trace(int *n);
bool wf_overflow(void);

/* "open", "write", ... */
const char *wf_op_name(WfOp op);

/* One call as text, e.g. "rename(/tmp/x/r.h5.tmp-12, /tmp/x/r.h5) = 0". */
void wf_call_text(const WfCall *c, char *buf, size_t n);

#endif
