// Package libflaw holds switches for deliberate bugs in package lock. Only
// the conformance suite's self-test (memory's TestSuiteCatchesFlaws) turns
// one on, in a child process, before any lock is taken, to prove that the
// suite catches a library that breaks a promise. Every switch is off in any
// other program.
package libflaw

// The switches.
var (
	DeadlineFromReply     bool // a lease's deadline counted from the reply instead of the send
	ZeroDrift             bool // no drift allowance
	RenewLongerTTL        bool // a renewal's deadline counted with the client's default TTL, not the lease's
	ShortTokens           bool // 16-bit owner tokens
	UnknownRenewIsSuccess bool // a renewal of unknown outcome extends the deadline
	SchedulerNoRearm      bool // the scheduler's timer is not moved earlier for a lease due sooner
	WatchdogReacquires    bool // a renewal that finds the lock gone takes it again
	CancelKeepsTurn       bool // an Acquire cancelled in the client's queue stays in it
	HandoverPrevDeadline  bool // a lease handed over ahead of the store is valid until the previous holder's deadline, whatever its own TTL
	HandoverUnknownKeeps  bool // a handover of unknown outcome ends the new lease but frees neither token
)
