; dlvm_eq/codegen/runtime/native_pool.ll -- the native worker pool, in LLVM IR.
;
; native_pool.py loads this file, checks the constants below against its own and has llvmlite
; parse, verify and compile it (tests/test_native_pool.py parses and verifies it too). The
; module docstring of native_pool.py describes the control block and the protocol.
;
; One entry function; `op` selects: 0 = worker loop of worker a (returns or parks on `stop`),
; 1 = run fn a on blocks b (c of them) with at most d helpers, 2 = stop with mode a,
; 3 = run fn a on blocks b (c of them) on the calling thread alone (touches no shared word),
; 4 = make the BLAS callback (`{symbol}_blas`) run on this pool and store its address in BLAS_CB,
; 5 / 6 = take / release the BLAS callback's mutex (around a fork: blas_threads.py).
; `{symbol}` is replaced by a hash of this text when it is compiled.
;
; The numbers written into the code: word indices in the control block (and in a worker's
; line), futex operations, the syscall number, MAX_ARGS arguments per block. native_pool.py
; refuses a file whose list differs from its constants.
; const BLAS_CB = 28
; const BLAS_LOCK = 22
; const BLAS_POOLED = 20
; const BLAS_THREADED = 21
; const BLOCKS = 2
; const CALLER_BUDGET = 10
; const CALLER_WAITING = 9
; const CLOSED = 4294967295
; const DONE = 8
; const FN = 1
; const FUTEX_WAIT_PRIVATE = 128
; const FUTEX_WAKE_PRIVATE = 129
; const GAP = 7
; const HELPERS = 4
; const MAX_ARGS = 32
; const MIN_SPIN = 26
; const N = 3
; const OWNER = 27
; const PTHREAD_CREATE = 29
; const PTHREAD_JOIN = 30
; const REST = 19
; const SLEEPERS = 17
; const SPIN = 6
; const STOP = 18
; const STOP_PARK = 2
; const SYSCALL = 5
; const SYS_FUTEX = 202
; const TIMEOUT_S = 24
; const WAITS_SLEPT = 12
; const WAIT_TICKS = 11
; const WAKE = 16
; const WORKERS = 31
; const W_BUDGET = 2
; const W_PARK = 4
; const W_PREEMPTED = 3
; const W_STATUS = 1
; const _HEADER = 32
; const _LINE = 8
declare void @llvm.x86.sse2.pause()
declare i64 @llvm.readcyclecounter()

define internal void @futex(ptr %pool, ptr %addr, i64 %op, i64 %val, ptr %ts) {
  %sysp = getelementptr i64, ptr %pool, i64 5
  %si = load i64, ptr %sysp
  %sys = inttoptr i64 %si to ptr
  %r = call i64 (i64, ...) %sys(i64 202, ptr %addr, i64 %op, i64 %val, ptr %ts)
  ret void
}

define internal void @call_block(ptr %fn, ptr %blocks, i64 %i) {
  %off = mul i64 %i, 32
  %blk = getelementptr i64, ptr %blocks, i64 %off
  %p0 = getelementptr i64, ptr %blk, i64 0
  %a0 = load i64, ptr %p0
  %p1 = getelementptr i64, ptr %blk, i64 1
  %a1 = load i64, ptr %p1
  %p2 = getelementptr i64, ptr %blk, i64 2
  %a2 = load i64, ptr %p2
  %p3 = getelementptr i64, ptr %blk, i64 3
  %a3 = load i64, ptr %p3
  %p4 = getelementptr i64, ptr %blk, i64 4
  %a4 = load i64, ptr %p4
  %p5 = getelementptr i64, ptr %blk, i64 5
  %a5 = load i64, ptr %p5
  %p6 = getelementptr i64, ptr %blk, i64 6
  %a6 = load i64, ptr %p6
  %p7 = getelementptr i64, ptr %blk, i64 7
  %a7 = load i64, ptr %p7
  %p8 = getelementptr i64, ptr %blk, i64 8
  %a8 = load i64, ptr %p8
  %p9 = getelementptr i64, ptr %blk, i64 9
  %a9 = load i64, ptr %p9
  %p10 = getelementptr i64, ptr %blk, i64 10
  %a10 = load i64, ptr %p10
  %p11 = getelementptr i64, ptr %blk, i64 11
  %a11 = load i64, ptr %p11
  %p12 = getelementptr i64, ptr %blk, i64 12
  %a12 = load i64, ptr %p12
  %p13 = getelementptr i64, ptr %blk, i64 13
  %a13 = load i64, ptr %p13
  %p14 = getelementptr i64, ptr %blk, i64 14
  %a14 = load i64, ptr %p14
  %p15 = getelementptr i64, ptr %blk, i64 15
  %a15 = load i64, ptr %p15
  %p16 = getelementptr i64, ptr %blk, i64 16
  %a16 = load i64, ptr %p16
  %p17 = getelementptr i64, ptr %blk, i64 17
  %a17 = load i64, ptr %p17
  %p18 = getelementptr i64, ptr %blk, i64 18
  %a18 = load i64, ptr %p18
  %p19 = getelementptr i64, ptr %blk, i64 19
  %a19 = load i64, ptr %p19
  %p20 = getelementptr i64, ptr %blk, i64 20
  %a20 = load i64, ptr %p20
  %p21 = getelementptr i64, ptr %blk, i64 21
  %a21 = load i64, ptr %p21
  %p22 = getelementptr i64, ptr %blk, i64 22
  %a22 = load i64, ptr %p22
  %p23 = getelementptr i64, ptr %blk, i64 23
  %a23 = load i64, ptr %p23
  %p24 = getelementptr i64, ptr %blk, i64 24
  %a24 = load i64, ptr %p24
  %p25 = getelementptr i64, ptr %blk, i64 25
  %a25 = load i64, ptr %p25
  %p26 = getelementptr i64, ptr %blk, i64 26
  %a26 = load i64, ptr %p26
  %p27 = getelementptr i64, ptr %blk, i64 27
  %a27 = load i64, ptr %p27
  %p28 = getelementptr i64, ptr %blk, i64 28
  %a28 = load i64, ptr %p28
  %p29 = getelementptr i64, ptr %blk, i64 29
  %a29 = load i64, ptr %p29
  %p30 = getelementptr i64, ptr %blk, i64 30
  %a30 = load i64, ptr %p30
  %p31 = getelementptr i64, ptr %blk, i64 31
  %a31 = load i64, ptr %p31
  call void %fn(i64 %a0, i64 %a1, i64 %a2, i64 %a3, i64 %a4, i64 %a5, i64 %a6, i64 %a7, i64 %a8, i64 %a9, i64 %a10, i64 %a11, i64 %a12, i64 %a13, i64 %a14, i64 %a15, i64 %a16, i64 %a17, i64 %a18, i64 %a19, i64 %a20, i64 %a21, i64 %a22, i64 %a23, i64 %a24, i64 %a25, i64 %a26, i64 %a27, i64 %a28, i64 %a29, i64 %a30, i64 %a31)
  ret void
}

; Claim the next chunk of the current run and run it: 1 ran one, 2 lost a race (try again),
; 0 nothing left (every chunk claimed, or no run open). `n` is read after `state`: the run
; stores n before publishing (gen, 0), so it is this generation's n or a later one's, and
; then the CAS from this (gen, i) fails (see the module docstring).
define internal i64 @claim(ptr %pool) {
entry:
  %np = getelementptr i64, ptr %pool, i64 3
  %fnp = getelementptr i64, ptr %pool, i64 1
  %bp = getelementptr i64, ptr %pool, i64 2
  %s = load atomic i64, ptr %pool seq_cst, align 8
  %i = and i64 %s, 4294967295
  %n = load atomic i64, ptr %np seq_cst, align 8
  %left = icmp ult i64 %i, %n
  br i1 %left, label %try, label %none
try:
  %s1 = add i64 %s, 1
  %r = cmpxchg ptr %pool, i64 %s, i64 %s1 seq_cst seq_cst
  %ok = extractvalue { i64, i1 } %r, 1
  br i1 %ok, label %call, label %lost
call:
  %fni = load atomic i64, ptr %fnp monotonic, align 8
  %fn = inttoptr i64 %fni to ptr
  %bi = load atomic i64, ptr %bp monotonic, align 8
  %blocks = inttoptr i64 %bi to ptr
  call void @call_block(ptr %fn, ptr %blocks, i64 %i)
  ret i64 1
lost:
  ret i64 2
none:
  ret i64 0
}

define internal void @worker(ptr %pool, i64 %w) {
entry:
  %lo = mul i64 %w, 8
  %lo1 = add i64 %lo, 32
  %me = getelementptr i64, ptr %pool, i64 %lo1
  %statusp = getelementptr i64, ptr %me, i64 1
  %budgetp = getelementptr i64, ptr %me, i64 2
  %preemp = getelementptr i64, ptr %me, i64 3
  %parkp = getelementptr i64, ptr %me, i64 4
  %wakep = getelementptr i64, ptr %pool, i64 16
  %sleepersp = getelementptr i64, ptr %pool, i64 17
  %stopp = getelementptr i64, ptr %pool, i64 18
  %helpersp = getelementptr i64, ptr %pool, i64 4
  %donep = getelementptr i64, ptr %pool, i64 8
  %waitingp = getelementptr i64, ptr %pool, i64 9
  %spinp = getelementptr i64, ptr %pool, i64 6
  %gapp = getelementptr i64, ptr %pool, i64 7
  %minp = getelementptr i64, ptr %pool, i64 26
  %restp = getelementptr i64, ptr %pool, i64 19
  %max = load i64, ptr %spinp
  %gap = load i64, ptr %gapp
  %min = load i64, ptr %minp
  br label %top
top:
  %stop = load atomic i64, ptr %stopp seq_cst, align 8
  %stopping = icmp ne i64 %stop, 0
  br i1 %stopping, label %halt, label %look
look:
  ; `wake` is read before `state`: a run published after this read changes `wake` too
  %w0 = load atomic i64, ptr %wakep seq_cst, align 8
  %h = load atomic i64, ptr %helpersp seq_cst, align 8
  %wanted = icmp slt i64 %w, %h
  br i1 %wanted, label %try, label %idle
try:
  %r = call i64 @claim(ptr %pool)
  switch i64 %r, label %idle [ i64 1, label %ran
                               i64 2, label %top ]
ran:
  %d = atomicrmw add ptr %donep, i64 1 seq_cst
  %c = load atomic i64, ptr %me monotonic, align 8
  %c1 = add i64 %c, 1
  store atomic i64 %c1, ptr %me monotonic, align 8
  %wt = load atomic i64, ptr %waitingp seq_cst, align 8
  %waiting = icmp ne i64 %wt, 0
  br i1 %waiting, label %wakecaller, label %top
wakecaller:
  call void @futex(ptr %pool, ptr %donep, i64 129, i64 1, ptr null)
  br label %top
idle:
  %t0 = call i64 @llvm.readcyclecounter()
  %b = load atomic i64, ptr %budgetp monotonic, align 8
  br label %spin
spin:
  %tprev = phi i64 [ %t0, %idle ], [ %t, %spin3 ]
  %cur = load atomic i64, ptr %wakep seq_cst, align 8
  %changed = icmp ne i64 %cur, %w0
  br i1 %changed, label %hit, label %spin1
hit:
  ; spinning paid off: allow longer spins again, slowly (halved at once when descheduled)
  %bq = lshr i64 %b, 4
  %bq1 = add i64 %bq, 1
  %b2 = add i64 %b, %bq1
  %big = icmp ugt i64 %b2, %max
  %b3 = select i1 %big, i64 %max, i64 %b2
  store atomic i64 %b3, ptr %budgetp monotonic, align 8
  br label %top
spin1:
  %st = load atomic i64, ptr %stopp monotonic, align 8
  %st1 = icmp ne i64 %st, 0
  br i1 %st1, label %halt, label %spin1r
spin1r:
  ; the caller's program call has ended (`rest`): the core is the user's code's now (numpy's
  ; BLAS threads, say), so sleep instead of spinning; the next run wakes us
  %rs = load atomic i64, ptr %restp monotonic, align 8
  %resting = icmp ne i64 %rs, 0
  br i1 %resting, label %sleep, label %spin2
spin2:
  call void @llvm.x86.sse2.pause()
  %t = call i64 @llvm.readcyclecounter()
  %step = sub i64 %t, %tprev
  %preempted = icmp ugt i64 %step, %gap
  br i1 %preempted, label %backoff, label %spin3
spin3:
  %dt = sub i64 %t, %t0
  %long = icmp ugt i64 %dt, %b
  br i1 %long, label %sleep, label %spin
backoff:
  ; descheduled while spinning: the core is wanted elsewhere, so spin less and sleep now
  %bh = lshr i64 %b, 1
  %small = icmp ult i64 %bh, %min
  %bn = select i1 %small, i64 %min, i64 %bh
  store atomic i64 %bn, ptr %budgetp monotonic, align 8
  %pc = load atomic i64, ptr %preemp monotonic, align 8
  %pc1 = add i64 %pc, 1
  store atomic i64 %pc1, ptr %preemp monotonic, align 8
  br label %sleep
sleep:
  store atomic i64 1, ptr %statusp monotonic, align 8
  %sl = atomicrmw add ptr %sleepersp, i64 1 seq_cst
  %cur2 = load atomic i64, ptr %wakep seq_cst, align 8
  %st2 = load atomic i64, ptr %stopp seq_cst, align 8
  %same = icmp eq i64 %cur2, %w0
  %go = icmp eq i64 %st2, 0
  %both = and i1 %same, %go
  br i1 %both, label %wait, label %woke
wait:
  %w32 = and i64 %w0, 4294967295
  call void @futex(ptr %pool, ptr %wakep, i64 128, i64 %w32, ptr null)
  br label %woke
woke:
  %sl2 = atomicrmw sub ptr %sleepersp, i64 1 seq_cst
  store atomic i64 0, ptr %statusp monotonic, align 8
  br label %top
halt:
  %sv = load atomic i64, ptr %stopp seq_cst, align 8
  %park = icmp eq i64 %sv, 2
  br i1 %park, label %parked, label %exit
parked:
  ; never returns: the interpreter may be finalizing (see the module docstring)
  store atomic i64 2, ptr %statusp seq_cst, align 8
  call void @futex(ptr %pool, ptr %parkp, i64 128, i64 0, ptr null)
  br label %parked
exit:
  store atomic i64 3, ptr %statusp seq_cst, align 8
  ret void
}

define internal void @run(ptr %pool, i64 %fn, i64 %blocks, i64 %n, i64 %helpers) {
entry:
  %fnp = getelementptr i64, ptr %pool, i64 1
  %bp = getelementptr i64, ptr %pool, i64 2
  %np = getelementptr i64, ptr %pool, i64 3
  %hp = getelementptr i64, ptr %pool, i64 4
  %donep = getelementptr i64, ptr %pool, i64 8
  %waitingp = getelementptr i64, ptr %pool, i64 9
  %cbp = getelementptr i64, ptr %pool, i64 10
  %spinp = getelementptr i64, ptr %pool, i64 6
  %minp = getelementptr i64, ptr %pool, i64 26
  %wakep = getelementptr i64, ptr %pool, i64 16
  %sleepersp = getelementptr i64, ptr %pool, i64 17
  %tsp = getelementptr i64, ptr %pool, i64 24
  %wtp = getelementptr i64, ptr %pool, i64 11
  %wsp = getelementptr i64, ptr %pool, i64 12
  %gapp = getelementptr i64, ptr %pool, i64 7
  %restp = getelementptr i64, ptr %pool, i64 19
  store atomic i64 0, ptr %restp monotonic, align 8
  ; the state is (gen, CLOSED) here: no claim can succeed while the task is replaced
  store atomic i64 %fn, ptr %fnp seq_cst, align 8
  store atomic i64 %blocks, ptr %bp seq_cst, align 8
  store atomic i64 %n, ptr %np seq_cst, align 8
  store atomic i64 %helpers, ptr %hp seq_cst, align 8
  store atomic i64 0, ptr %donep seq_cst, align 8
  %s = load atomic i64, ptr %pool seq_cst, align 8
  %g = lshr i64 %s, 32
  %g1 = add i64 %g, 1
  %s0 = shl i64 %g1, 32
  store atomic i64 %s0, ptr %pool seq_cst, align 8
  %any = icmp sgt i64 %helpers, 0
  br i1 %any, label %post, label %drain
post:
  %old = atomicrmw add ptr %wakep, i64 1 seq_cst
  %sl = load atomic i64, ptr %sleepersp seq_cst, align 8
  %asleep = icmp sgt i64 %sl, 0
  br i1 %asleep, label %wake, label %drain
wake:
  call void @futex(ptr %pool, ptr %wakep, i64 129, i64 %helpers, ptr null)
  br label %drain
drain:
  %mine = phi i64 [ 0, %entry ], [ 0, %post ], [ 0, %wake ], [ %mine1, %again ]
  %r = call i64 @claim(ptr %pool)
  %none = icmp eq i64 %r, 0
  br i1 %none, label %close, label %again
again:
  %got = icmp eq i64 %r, 1
  %inc = zext i1 %got to i64
  %mine1 = add i64 %mine, %inc
  br label %drain
close:
  %sc = or i64 %s0, 4294967295
  store atomic i64 %sc, ptr %pool seq_cst, align 8
  %want = sub i64 %n, %mine
  %t0 = call i64 @llvm.readcyclecounter()
  %budget = load atomic i64, ptr %cbp monotonic, align 8
  %gap = load i64, ptr %gapp
  br label %wait
wait:
  %overran = phi i1 [ false, %close ], [ %overran, %wait2 ], [ true, %slept ]
  %tprev = phi i64 [ %t0, %close ], [ %t, %wait2 ], [ %t0, %slept ]
  %d = load atomic i64, ptr %donep seq_cst, align 8
  %fin = icmp eq i64 %d, %want
  br i1 %fin, label %finished, label %wait1
wait1:
  call void @llvm.x86.sse2.pause()
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %long = icmp ugt i64 %dt, %budget
  ; descheduled while spinning (perhaps for the very helper we wait for): sleep at once
  %step = sub i64 %t, %tprev
  %preempted = icmp ugt i64 %step, %gap
  %give_up = or i1 %long, %preempted
  br i1 %give_up, label %sleep, label %wait2
wait2:
  br label %wait
sleep:
  ; a claimed chunk is late (its helper may be descheduled): give up this core for a while
  store atomic i64 1, ptr %waitingp seq_cst, align 8
  %d2 = load atomic i64, ptr %donep seq_cst, align 8
  %fin2 = icmp eq i64 %d2, %want
  br i1 %fin2, label %slept, label %fwait
fwait:
  %d32 = and i64 %d2, 4294967295
  call void @futex(ptr %pool, ptr %donep, i64 128, i64 %d32, ptr %tsp)
  br label %slept
slept:
  store atomic i64 0, ptr %waitingp seq_cst, align 8
  br label %wait
finished:
  ; a wait that overran halves the next one's spin; one that did not lets it grow by 1/16
  %max = load i64, ptr %spinp
  %min = load i64, ptr %minp
  %bh = lshr i64 %budget, 1
  %small = icmp ult i64 %bh, %min
  %bl = select i1 %small, i64 %min, i64 %bh
  %bq = lshr i64 %budget, 4
  %bq1 = add i64 %bq, 1
  %b2 = add i64 %budget, %bq1
  %big = icmp ugt i64 %b2, %max
  %bm = select i1 %big, i64 %max, i64 %b2
  %bs = select i1 %overran, i64 %bl, i64 %bm
  store atomic i64 %bs, ptr %cbp monotonic, align 8
  ; counters for pool.caller_stats(): time spent waiting for claimed chunks, waits that slept
  %tend = call i64 @llvm.readcyclecounter()
  %waited = sub i64 %tend, %t0
  %wt0 = load atomic i64, ptr %wtp monotonic, align 8
  %wt1 = add i64 %wt0, %waited
  store atomic i64 %wt1, ptr %wtp monotonic, align 8
  %ws0 = load atomic i64, ptr %wsp monotonic, align 8
  %slept1 = zext i1 %overran to i64
  %ws1 = add i64 %ws0, %slept1
  store atomic i64 %ws1, ptr %wsp monotonic, align 8
  ret void
}

; Stop takes the pool for good first (waiting out a run in flight, whose jobs may need every
; worker: OpenBLAS's do), so no run starts on workers that are about to go; later runs find
; it owned and run alone (ours) or on threads of their own (OpenBLAS's).
define internal void @stop(ptr %pool, i64 %mode) {
entry:
  %stopp = getelementptr i64, ptr %pool, i64 18
  %wakep = getelementptr i64, ptr %pool, i64 16
  br label %take
take:
  %mine = call i1 @own(ptr %pool)
  br i1 %mine, label %taken, label %busy
busy:
  call void @llvm.x86.sse2.pause()
  br label %take
taken:
  store atomic i64 %mode, ptr %stopp seq_cst, align 8
  %old = atomicrmw add ptr %wakep, i64 1 seq_cst
  call void @futex(ptr %pool, ptr %wakep, i64 129, i64 2147483647, ptr null)
  ret void
}

define internal void @alone(i64 %fn, i64 %blocks, i64 %n) {
entry:
  %f = inttoptr i64 %fn to ptr
  %b = inttoptr i64 %blocks to ptr
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %exit
body:
  call void @call_block(ptr %f, ptr %b, i64 %i)
  %i1 = add i64 %i, 1
  br label %loop
exit:
  ret void
}

; One run owns the shared task at a time: `owner` goes 0 -> 1 for it (a compare-and-swap, so
; that Python's runs and OpenBLAS's, which come from C without the GIL, exclude each other).
define internal i1 @own(ptr %pool) {
  %ownp = getelementptr i64, ptr %pool, i64 27
  %r = cmpxchg ptr %ownp, i64 0, i64 1 seq_cst seq_cst
  %ok = extractvalue { i64, i1 } %r, 1
  ret i1 %ok
}

define internal void @disown(ptr %pool) {
  %ownp = getelementptr i64, ptr %pool, i64 27
  store atomic i64 0, ptr %ownp seq_cst, align 8
  ret void
}

@blas_pool = internal global ptr null

; A futex mutex (Drepper, "Futexes are tricky", mutex 2): 0 free, 1 taken, 2 taken and waited for.
define internal void @lock(ptr %pool, ptr %m) {
entry:
  %r = cmpxchg ptr %m, i64 0, i64 1 seq_cst seq_cst
  %ok = extractvalue { i64, i1 } %r, 1
  br i1 %ok, label %done, label %contended
contended:
  %c0 = extractvalue { i64, i1 } %r, 0
  br label %loop
loop:
  %c = phi i64 [ %c0, %contended ], [ %c3, %retry ]
  %two = icmp eq i64 %c, 2
  br i1 %two, label %sleep, label %mark
mark:
  %r2 = cmpxchg ptr %m, i64 1, i64 2 seq_cst seq_cst
  %was = extractvalue { i64, i1 } %r2, 0
  %freed = icmp eq i64 %was, 0
  br i1 %freed, label %retry, label %sleep
sleep:
  call void @futex(ptr %pool, ptr %m, i64 128, i64 2, ptr null)
  br label %retry
retry:
  %r3 = cmpxchg ptr %m, i64 0, i64 2 seq_cst seq_cst
  %c3 = extractvalue { i64, i1 } %r3, 0
  %got = extractvalue { i64, i1 } %r3, 1
  br i1 %got, label %done, label %loop
done:
  ret void
}

define internal void @unlock(ptr %pool, ptr %m) {
entry:
  %old = atomicrmw sub ptr %m, i64 1 seq_cst
  %alone = icmp eq i64 %old, 1
  br i1 %alone, label %done, label %wake
wake:
  store atomic i64 0, ptr %m seq_cst, align 8
  call void @futex(ptr %pool, ptr %m, i64 129, i64 1, ptr null)
  br label %done
done:
  ret void
}

; A job of OpenBLAS's on a thread of its own: row = (i, job data, buffer index, dojob).
define internal ptr @blas_thread(ptr %row) {
  %p1 = getelementptr i64, ptr %row, i64 1
  %p2 = getelementptr i64, ptr %row, i64 2
  %p3 = getelementptr i64, ptr %row, i64 3
  %a0 = load i64, ptr %row
  %a1 = load i64, ptr %p1
  %a2 = load i64, ptr %p2
  %fi = load i64, ptr %p3
  %f = inttoptr i64 %fi to ptr
  call void %f(i64 %a0, i64 %a1, i64 %a2)
  ret ptr null
}

; OpenBLAS's caller-managed threading (openblas_set_threads_callback_function): run
; dojob(i, jobdata + i * elsize, data) for i < numjobs, ALL AT ONCE, and return when every job
; is done. The jobs of a level-3 call wait for each other's packed panels, so each needs a
; thread of its own: on the pool when it is free and has numjobs - 1 workers, else job 0 here
; and the others on threads made for them (pthread_create; a nested or concurrent call).
define void @"{symbol}_blas"(i32 %sync, ptr %dojob, i32 %numjobs, i64 %elsize, ptr %jobdata, i32 %data) {
entry:
  %pool = load ptr, ptr @blas_pool
  %n = sext i32 %numjobs to i64
  %few = icmp slt i64 %n, 1
  br i1 %few, label %done, label %start
start:
  %dd = sext i32 %data to i64
  %jd = ptrtoint ptr %jobdata to i64
  %fn = ptrtoint ptr %dojob to i64
  %cells = mul i64 %n, 32
  %blocks = alloca i64, i64 %cells, align 16
  br label %fill
fill:
  %i = phi i64 [ 0, %start ], [ %i1, %fill ]
  %at = mul i64 %i, 32
  %q0 = getelementptr i64, ptr %blocks, i64 %at
  %q1 = getelementptr i64, ptr %q0, i64 1
  %q2 = getelementptr i64, ptr %q0, i64 2
  %q3 = getelementptr i64, ptr %q0, i64 3
  %off = mul i64 %i, %elsize
  %job = add i64 %jd, %off
  store i64 %i, ptr %q0
  store i64 %job, ptr %q1
  store i64 %dd, ptr %q2
  store i64 %fn, ptr %q3
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %n
  br i1 %more, label %fill, label %filled
filled:
  %workersp = getelementptr i64, ptr %pool, i64 31
  %stopp = getelementptr i64, ptr %pool, i64 18
  %pcp = getelementptr i64, ptr %pool, i64 29
  %pjp = getelementptr i64, ptr %pool, i64 30
  %pooledp = getelementptr i64, ptr %pool, i64 20
  %threadedp = getelementptr i64, ptr %pool, i64 21
  %mutexp = getelementptr i64, ptr %pool, i64 22
  ; OpenBLAS hands each job its buffers by thread number (0 .. numjobs-1), the same numbers
  ; for every call: two calls at once (an sgemm and a dgemm from two Python threads, which
  ; OpenBLAS's own server would queue) would pack into the same buffers. One at a time.
  call void @lock(ptr %pool, ptr %mutexp)
  %workers = load atomic i64, ptr %workersp monotonic, align 8
  %need = sub i64 %n, 1
  %fits = icmp sle i64 %need, %workers
  %stop = load atomic i64, ptr %stopp seq_cst, align 8
  %live = icmp eq i64 %stop, 0
  %usable = and i1 %fits, %live
  br i1 %usable, label %try, label %threads
try:
  %mine = call i1 @own(ptr %pool)
  br i1 %mine, label %pooled, label %threads
pooled:
  %np0 = atomicrmw add ptr %pooledp, i64 1 monotonic
  %bi = ptrtoint ptr %blocks to i64
  call void @run(ptr %pool, i64 %fn, i64 %bi, i64 %n, i64 %need)
  call void @disown(ptr %pool)
  br label %finished
threads:
  %nt0 = atomicrmw add ptr %threadedp, i64 1 monotonic
  %tids = alloca i64, i64 %n, align 8
  %pci = load i64, ptr %pcp
  %pc = inttoptr i64 %pci to ptr
  %pji = load i64, ptr %pjp
  %pj = inttoptr i64 %pji to ptr
  br label %spawn
spawn:
  %j = phi i64 [ 1, %threads ], [ %j1, %spawned ]
  %go = icmp slt i64 %j, %n
  br i1 %go, label %make, label %here
make:
  %jat = mul i64 %j, 32
  %row = getelementptr i64, ptr %blocks, i64 %jat
  %tid = getelementptr i64, ptr %tids, i64 %j
  br label %create
create:
  %rc = call i32 %pc(ptr %tid, ptr null, ptr @blas_thread, ptr %row)
  %made = icmp eq i32 %rc, 0
  ; EAGAIN (threads exhausted for the moment): try again; a job run here instead would wait
  ; for the others forever
  br i1 %made, label %spawned, label %create
spawned:
  %j1 = add i64 %j, 1
  br label %spawn
here:
  call ptr @blas_thread(ptr %blocks)
  br label %join
join:
  %k = phi i64 [ 1, %here ], [ %k1, %joined ]
  %jn = icmp slt i64 %k, %n
  br i1 %jn, label %wait, label %finished
wait:
  %tk = getelementptr i64, ptr %tids, i64 %k
  %t = load i64, ptr %tk
  %jr = call i32 %pj(i64 %t, ptr null)
  br label %joined
joined:
  %k1 = add i64 %k, 1
  br label %join
finished:
  call void @unlock(ptr %pool, ptr %mutexp)
  br label %done
done:
  ret void
}

define void @"{symbol}"(i64 %op, ptr %pool, i64 %a, i64 %b, i64 %c, i64 %d) {
entry:
  switch i64 %op, label %alone [ i64 0, label %wk
                                 i64 1, label %rn
                                 i64 2, label %st
                                 i64 4, label %blas
                                 i64 5, label %bl
                                 i64 6, label %bu ]
wk:
  call void @worker(ptr %pool, i64 %a)
  ret void
rn:
  %mine = call i1 @own(ptr %pool)
  br i1 %mine, label %owned, label %alone
owned:
  call void @run(ptr %pool, i64 %a, i64 %b, i64 %c, i64 %d)
  call void @disown(ptr %pool)
  ret void
blas:
  ; OpenBLAS's jobs will run on this pool: remember it, and say where the callback is
  store ptr %pool, ptr @blas_pool
  %cbp = getelementptr i64, ptr %pool, i64 28
  %cb = ptrtoint ptr @"{symbol}_blas" to i64
  store i64 %cb, ptr %cbp
  ret void
bl:
  %blp = getelementptr i64, ptr %pool, i64 22
  call void @lock(ptr %pool, ptr %blp)
  ret void
bu:
  %bup = getelementptr i64, ptr %pool, i64 22
  call void @unlock(ptr %pool, ptr %bup)
  ret void
st:
  call void @stop(ptr %pool, i64 %a)
  ret void
alone:
  call void @alone(i64 %a, i64 %b, i64 %c)
  ret void
}
