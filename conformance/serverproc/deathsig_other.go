//go:build !linux

package serverproc

import "syscall"

// dieWithParent does nothing where the kernel has no parent-death signal:
// a server whose test process dies outlives it.
func dieWithParent(*syscall.SysProcAttr) {}
