#!/bin/bash
# slurm.sh KVREPRO SOURCE_DIR WORK: docs/sharding.md's Slurm recipe on a real
# scheduler. The test starts a single-node Slurm of its own (munged,
# slurmctld, slurmd; 2 CPUs on 127.0.0.1, every state, spool, log and socket
# under WORK), takes the two batch scripts and the submit commands out of
# docs/sharding.md's "Slurm" section as written, runs them from a directory
# laid out as the doc assumes (build/kvrepro), waits for the array and the
# merge job (bounded), and checks that
#   - every array task and the merge job completed with exit 0;
#   - the merged report holds the same runs with the same verdicts as the
#     unsharded gate run here with the same options (kvrepro show's rows,
#     sorted, without the run index), and the same count line.
# Every daemon it started is stopped on every exit path (trap). Exit 77
# (skipped, with the reason) without slurm-wlm and munge, without root (slurmd
# launches jobs as root here) or with fewer than 2 CPUs.
# The scheduler's log (submissions, queue, job states, job output) is
# WORK/slurm-run.log and is printed at the end.
set -u
KVREPRO=$1
SRC=$2
WORK=$3
DOC="$SRC/docs/sharding.md"
TIMEOUT=${KV_SLURM_TIMEOUT:-900}   # seconds for the array and the merge job together

skip() { echo "skipped: $*"; exit 77; }
for c in munged slurmctld slurmd sbatch squeue sinfo scontrol scancel; do
    command -v "$c" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin"
    command -v "$c" >/dev/null 2>&1 \
        || skip "no $c: install the Debian packages slurm-wlm and munge (make slurm-check does, as root)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to launch jobs; run as root"
[ "$(nproc)" -ge 2 ] || skip "the doc's array asks 2 CPUs per task; this machine has $(nproc)"

rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
LOG="$WORK/slurm-run.log"
: > "$LOG"
log() { echo "$*" | tee -a "$LOG"; }
fail() { log "FAIL: $*"; exit 1; }

# --- daemons, stopped on every exit path ----------------------------------
PIDS=""
cleanup() {
    rc=$?
    trap - EXIT INT TERM HUP
    if [ -n "${SLURM_CONF:-}" ] && [ -n "$PIDS" ]; then
        # Jobs first (their processes are slurmstepd's, not ours), then the
        # daemons, newest first.
        scancel --quiet --full --user="$(id -un)" 2>/dev/null
        for _ in $(seq 1 20); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $PIDS; do
        for _ in $(seq 1 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# A free port: nothing answers a connection on it.
free_port() {
    p=$1
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}
# Ports off the defaults (6817/6818), so that a machine's own Slurm is left alone.
CTLD_PORT=$(free_port $((20000 + $$ % 20000)))
SLURMD_PORT=$(free_port $((CTLD_PORT + 1)))

mkdir -p "$WORK/munge" "$WORK/state" "$WORK/spool" "$WORK/daemons"
chmod 700 "$WORK/munge"
dd if=/dev/urandom of="$WORK/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge/munge.key"
MUNGE_SOCKET="$WORK/munge/munge.socket"
munged --foreground --force --key-file="$WORK/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$WORK/munge/munged.pid" --seed-file="$WORK/munge/munged.seed" \
    --log-file="$WORK/daemons/munged.log" > "$WORK/daemons/munged.out" 2>&1 &
PIDS="$! $PIDS"
for _ in $(seq 1 40); do [ -S "$MUNGE_SOCKET" ] && break; sleep 0.25; done
[ -S "$MUNGE_SOCKET" ] || { cat "$WORK/daemons/munged.log"; fail "munged did not start"; }

NODE=$(hostname -s)
cat > "$WORK/slurm.conf" <<EOF
ClusterName=kvrepro
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/daemons/slurmctld.pid
SlurmdPidFile=$WORK/daemons/slurmd.pid
SlurmctldLogFile=$WORK/daemons/slurmctld.log
SlurmdLogFile=$WORK/daemons/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$WORK/daemons/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MinJobAge=3600
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=kvrepro Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$WORK/slurm.conf"

slurmctld -D -i -f "$SLURM_CONF" > "$WORK/daemons/slurmctld.out" 2>&1 &
PIDS="$! $PIDS"
slurmd -D -f "$SLURM_CONF" > "$WORK/daemons/slurmd.out" 2>&1 &
PIDS="$! $PIDS"
up=""
for _ in $(seq 1 120); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null)
    case "$state" in idle*) up=1; break ;; esac
    sleep 0.5
done
if [ -z "$up" ]; then
    for f in "$WORK"/daemons/*.log "$WORK"/daemons/*.out; do echo "== $f"; tail -n 20 "$f"; done
    fail "the node did not come up idle (state '${state:-}')"
fi
log "slurm: $(sinfo -V), node $NODE idle, ports $CTLD_PORT/$SLURMD_PORT, munge $MUNGE_SOCKET"

# --- the recipe, as docs/sharding.md writes it ------------------------------
# block AFTER_TEXT: the first ```bash block of the doc's "## Slurm" section
# that follows a line containing AFTER_TEXT.
block() {
    awk -v after="$1" '
        /^## / { in_slurm = ($0 == "## Slurm") }
        in_slurm && index($0, after) { found = 1 }
        found && !inside && /^```bash$/ { inside = 1; next }
        inside && /^```$/ { exit }
        inside { print }
    ' "$DOC"
}
REPO="$WORK/repo"          # the "repository root" the doc submits from
OUTS=build/shards          # where the doc's jobs write their reports and logs
MERGED=$OUTS/merged.h5
mkdir -p "$REPO/build"
ln -s "$KVREPRO" "$REPO/build/kvrepro"
cd "$REPO" || fail "no $REPO"
block '`gate-shards.sbatch` is' > gate-shards.sbatch
block '`merge.sbatch` joins' > merge.sbatch
block 'Submit both' > submit.sh
for f in gate-shards.sbatch merge.sbatch submit.sh; do
    [ -s "$f" ] || fail "docs/sharding.md: no bash block for $f in its Slurm section"
    log "--- $f (from docs/sharding.md)"
    sed 's/^/    /' "$f" | tee -a "$LOG"
done
# The doc's submit commands, then the array's id for the checks below.
echo 'echo "array job $JOBID"' >> submit.sh
log "--- submitting"
out=$(bash -e submit.sh 2>&1) || { log "$out"; fail "the doc's submit commands failed"; }
log "$out"
ARRAY=$(echo "$out" | sed -n 's/^array job \([0-9][0-9]*\)$/\1/p')
MERGE=$(echo "$out" | sed -n 's/^Submitted batch job \([0-9][0-9]*\).*/\1/p')
[ -n "$ARRAY" ] && [ -n "$MERGE" ] || fail "no job ids in the submit output"

# --- wait (bounded) ---------------------------------------------------------
start=$(date +%s)
last=""
while :; do
    q=$(squeue -h -o '%.10i %.14j %.8T %R' 2>&1)
    if [ "$q" != "$last" ]; then
        log "--- squeue at +$(( $(date +%s) - start )) s"
        log "${q:-    (empty)}"
        last=$q
    fi
    [ -z "$q" ] && break
    if [ $(( $(date +%s) - start )) -gt "$TIMEOUT" ]; then
        fail "the jobs did not finish within $TIMEOUT s (KV_SLURM_TIMEOUT)"
    fi
    sleep 1
done
log "--- jobs done in $(( $(date +%s) - start )) s"

# --- every job completed with exit 0 -----------------------------------------
# fields NAME...: those fields of `scontrol -o show job`'s lines (one a job).
fields() {
    awk -v want="$*" 'BEGIN { n = split(want, w, " ") }
        { line = ""
          for (i = 1; i <= n; i++)
              for (j = 1; j <= NF; j++)
                  if (index($j, w[i] "=") == 1) line = line (line == "" ? "" : " ") $j
          print line }'
}
log "--- scontrol show job"
scontrol -o show job > "$WORK/jobs.txt" 2>&1
fields JobId ArrayJobId ArrayTaskId JobName JobState ExitCode RunTime Dependency \
    < "$WORK/jobs.txt" | tee -a "$LOG"
njobs=$(grep -c "JobName=kvrepro-gate" "$WORK/jobs.txt")
[ "$njobs" -eq 4 ] || fail "expected 4 array tasks, found $njobs"
bad=$(grep -v -E 'JobState=COMPLETED .*ExitCode=0:0' "$WORK/jobs.txt" | grep -E 'JobName=kvrepro-' \
    | fields JobId ArrayTaskId JobName JobState Reason ExitCode | tr '\n' ';')
[ -z "$bad" ] || fail "not every job completed with exit 0: $bad"
grep -q "JobId=$MERGE .*JobName=kvrepro-merge" "$WORK/jobs.txt" || fail "no merge job $MERGE"
log "--- jobcomp (the scheduler's completion records)"
fields JobId ArrayJobId ArrayTaskId Name JobState ExitCode StartTime EndTime \
    < "$WORK/daemons/jobcomp.txt" | tee -a "$LOG"
for f in "$OUTS"/*.out; do
    log "--- $f"
    grep -o 'shard [0-9]*/[0-9]* (from [^)]*)' "$f" | tee -a "$LOG"
    tail -n 3 "$f" | tee -a "$LOG"
done
# Task t of --array=0-3 ran shard t+1/4, found by --shard auto in Slurm's
# own variables.
for t in 0 1 2 3; do
    grep -q "shard $((t + 1))/4 (from SLURM_ARRAY_TASK_ID=$t, SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_COUNT=4)" \
        "$OUTS/gate-${ARRAY}_$t.out" || fail "task $t did not run shard $((t + 1))/4 from Slurm's variables"
done
[ -f "$MERGED" ] || fail "the merge job wrote no $MERGED"

# --- the merged report against the unsharded gate ------------------------------
log "--- the unsharded gate, same options (./build/kvrepro gate)"
t0=$(date +%s)
./build/kvrepro gate --report unsharded.h5 --junit unsharded.xml > unsharded.out 2>&1 \
    || { tail -n 20 unsharded.out; fail "the unsharded gate failed"; }
log "$(tail -n 1 unsharded.out) ($(( $(date +%s) - t0 )) s)"
# The run rows of `kvrepro show`, sorted, without the run index (it follows
# each merge input's order; the rest must match), as tests/cli_test.cmake.
rows() {
    ./build/kvrepro show "$1" > "$1.show" || fail "kvrepro show $1 failed"
    grep -E 'PASS|FAIL|SKIP' "$1.show" | sed -E 's/^ *[0-9]+  //' | LC_ALL=C sort
}
rows unsharded.h5 > unsharded.rows
rows "$MERGED" > merged.rows
n=$(wc -l < unsharded.rows)
log "show rows: unsharded $n, merged $(wc -l < merged.rows)"
[ "$n" -gt 0 ] || fail "the unsharded report has no runs"
if ! cmp -s unsharded.rows merged.rows; then
    diff unsharded.rows merged.rows | head -n 20 | tee -a "$LOG"
    fail "the merged report differs from the unsharded gate's"
fi
count_u=$(tail -n 1 unsharded.h5.show)
count_m=$(tail -n 1 "$MERGED.show")
log "count lines: unsharded '$count_u', merged '$count_m'"
[ "$count_u" = "$count_m" ] || fail "the count lines differ"
log "PASS: docs/sharding.md's Slurm array + merge on Slurm equals the unsharded gate"
