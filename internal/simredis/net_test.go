package simredis

import (
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// TestDeliveryEndsWithItsLink: a chunk still held back when its link
// closes is dropped at once. Were the pump to sleep out the delay, it
// would outlive the run: a bubble's clock stops once its main goroutine
// has returned, and synctest reports the sleeping pump as a deadlock (CI
// met this in TestSimRedlock, a reply held back 1.8 s at the run's end).
func TestDeliveryEndsWithItsLink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cc, _ := net.Pipe()
		sc, far := net.Pipe()
		defer far.Close()
		l := &link{nd: &node{}, cc: cc, sc: sc, done: make(chan struct{})}
		q := make(chan chunk, 1)
		q <- chunk{b: []byte("+OK\r\n"), at: time.Now().Add(time.Hour)}
		close(q)
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			l.deliver(q, sc, true)
		}()
		synctest.Wait()
		l.close()
		synctest.Wait()
		select {
		case <-ended:
		default:
			t.Fatal("the pump still waits out a chunk's delay after its link closed")
		}
		if !time.Now().Equal(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) {
			t.Fatalf("virtual time moved to %v: the pump slept out the delay", time.Now().UTC())
		}
	})
}
