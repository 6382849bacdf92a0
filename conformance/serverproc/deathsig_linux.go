package serverproc

import "syscall"

// dieWithParent has the kernel kill the server's main process when the
// test process dies (a test binary killed by go test's timeout, or by a
// pipe closed under it), so that no server outlives its test. A server's
// other processes notice their parent's death on their own.
func dieWithParent(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
