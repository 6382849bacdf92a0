package lock

// MaxConcurrentTicks is maxConcurrentTicks, for the tests of package
// lock_test.
const MaxConcurrentTicks = maxConcurrentTicks
