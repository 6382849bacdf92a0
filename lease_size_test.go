package lock

import (
	"testing"
	"unsafe"
)

// TestLeaseSize: a Lease stays in Go's 384-byte size class. A process
// holding hundreds of thousands of leases pays for every byte over it
// (issue 30: at most 580 bytes of heap per lease at 300,000 leases); a
// field added without regard to the layout moves it to the 416-byte class.
func TestLeaseSize(t *testing.T) {
	if got := unsafe.Sizeof(Lease{}); got > 384 {
		t.Errorf("unsafe.Sizeof(Lease{}) = %d bytes; want at most 384 (Go's size class below 416): pack small fields with the others at the end of the struct", got)
	}
}
