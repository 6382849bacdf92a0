package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// refresher sends lease keep-alives on one long-lived LeaseKeepAlive stream
// per backend, instead of a stream per keep-alive (what
// clientv3.KeepAliveOnce opens): opening a stream costs both ends more than
// the keep-alive itself, and an acquire with an idle lease, and every
// renewal, sends one.
//
// The server answers a stream's keep-alives one at a time, in the order it
// received them, so the answers are matched to the requests first in,
// first out. When the stream breaks, every keep-alive still waiting for its
// answer fails with an unknown outcome (it may have reached the leader),
// which the callers treat as they treat any keep-alive of unknown outcome
// (the lease is not reused; see leases); the next keep-alive opens a new
// stream. The stream requires a leader (clientv3.WithRequireLeader), as
// the client's own keep-alives do: a member cut off from the leader ends it
// rather than hold the keep-alives.
type refresher struct {
	cli *clientv3.Client

	// sendMu serializes sends, so that pending is in send order. The
	// receiver never takes it: a send blocked by flow control cannot keep
	// the receiver from reading the answers that free it.
	sendMu sync.Mutex
	mu     sync.Mutex // guards cur, closed and the streams' pending
	cur    *kaStream
	closed bool
	wg     sync.WaitGroup // receivers

	afterSend func() // tests: runs after each keep-alive went out
}

type kaStream struct {
	stream  pb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc
	pending []kaWaiter // in send order
	broken  bool
}

// kaWaiter is a keep-alive sent on a stream, waiting for its answer.
type kaWaiter struct {
	id clientv3.LeaseID
	ch chan kaAnswer
}

type kaAnswer struct {
	ttl int64
	err error
}

// errRefresherClosed is returned by keep-alives after close.
var errRefresherClosed = errors.New("etcd: backend closed")

// keepAlive refreshes lease id and returns the TTL the store restarted it
// with, rpctypes.ErrLeaseNotFound when the lease does not exist (expired or
// revoked), or another error when the outcome is unknown. It returns when
// ctx ends.
func (r *refresher) keepAlive(ctx context.Context, id clientv3.LeaseID) (int64, error) {
	ch, err := r.start(id)
	if err != nil {
		return 0, err
	}
	return await(ctx, ch)
}

// start sends a keep-alive of lease id and returns where its answer will
// come, for await: the caller may send other requests meanwhile. An error
// means the keep-alive was not sent.
func (r *refresher) start(id clientv3.LeaseID) (<-chan kaAnswer, error) {
	ch := make(chan kaAnswer, 1)
	if err := r.send(ch, id); err != nil {
		return nil, err
	}
	return ch, nil
}

// await returns the answer to a keep-alive that start sent, as keepAlive
// does.
func await(ctx context.Context, ch <-chan kaAnswer) (int64, error) {
	select {
	case a := <-ch:
		return a.ttl, a.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (r *refresher) send(ch chan kaAnswer, id clientv3.LeaseID) error {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	for attempt := 0; ; attempt++ {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return errRefresherClosed
		}
		s, err := r.streamLocked()
		if err != nil {
			r.mu.Unlock()
			return err
		}
		s.pending = append(s.pending, kaWaiter{id, ch})
		r.mu.Unlock()
		err = s.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)})
		if err == nil {
			if r.afterSend != nil {
				r.afterSend()
			}
			return nil
		}
		// The stream broke before this request went out (Send fails
		// only then: a request it accepted is on its way).
		r.mu.Lock()
		r.breakLocked(s)
		mine := len(s.pending) > 0 && s.pending[len(s.pending)-1].ch == ch
		if mine {
			s.pending = s.pending[:len(s.pending)-1]
		}
		r.mu.Unlock()
		if !mine {
			return nil // the receiver failed it already: ch has the answer
		}
		if attempt > 0 {
			return fmt.Errorf("etcd: keep-alive: %w", err)
		}
		// Once more, on a new stream.
	}
}

// streamLocked returns the current stream, opening one if there is none.
func (r *refresher) streamLocked() (*kaStream, error) {
	if r.cur != nil && !r.cur.broken {
		return r.cur, nil
	}
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(r.cli.Ctx()))
	stream, err := pb.NewLeaseClient(r.cli.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("etcd: keep-alive stream: %w", err)
	}
	s := &kaStream{stream: stream, cancel: cancel}
	r.cur = s
	r.wg.Add(1)
	go r.receive(s)
	return s, nil
}

// receive hands each answer on s to the keep-alive that waits for it, and
// fails the waiting ones when s breaks.
func (r *refresher) receive(s *kaStream) {
	defer r.wg.Done()
	for {
		resp, err := s.stream.Recv()
		r.mu.Lock()
		if err != nil {
			r.breakLocked(s)
			waiting := s.pending
			s.pending = nil
			r.mu.Unlock()
			for _, w := range waiting {
				w.ch <- kaAnswer{err: fmt.Errorf("etcd: keep-alive stream broke before the answer: %w", err)}
			}
			return
		}
		if len(s.pending) == 0 || s.pending[0].id != clientv3.LeaseID(resp.ID) {
			// An answer nobody asked for, or for another lease than
			// the first waiting: the stream is out of step. Its
			// waiters fail (unknown outcome) once Recv fails, now that
			// the stream is cancelled.
			r.breakLocked(s)
			r.mu.Unlock()
			continue
		}
		w := s.pending[0]
		s.pending = s.pending[1:]
		r.mu.Unlock()
		if resp.TTL <= 0 {
			w.ch <- kaAnswer{err: rpctypes.ErrLeaseNotFound}
		} else {
			w.ch <- kaAnswer{ttl: resp.TTL}
		}
	}
}

// breakLocked retires s: no more sends on it; its receiver fails what waits.
func (r *refresher) breakLocked(s *kaStream) {
	if !s.broken {
		s.broken = true
		s.cancel()
	}
	if r.cur == s {
		r.cur = nil
	}
}

// close ends the stream and waits for its receiver.
func (r *refresher) close() {
	r.mu.Lock()
	r.closed = true
	if r.cur != nil {
		r.breakLocked(r.cur)
	}
	r.mu.Unlock()
	r.wg.Wait()
}
