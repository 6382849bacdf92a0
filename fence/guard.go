package fence

import "sync"

// Guard fences resources that live in this process: a file, a map, a
// connection to a service that cannot check fences itself. It remembers,
// per resource name, the newest fence it accepted and that fence's holder.
// The zero Guard is ready to use; it is safe for concurrent use and must
// not be copied after first use.
//
// A Guard remembers every resource name it has accepted a fence for, for
// as long as it lives. Start a new Guard to start every resource over, as
// when the lock moves to another backend (fences of different backends are
// not comparable).
type Guard struct {
	mu        sync.Mutex
	resources map[string]*guarded
}

// guarded is one resource's newest accepted fence. Its mutex is held from
// the check until the write returns.
type guarded struct {
	mu     sync.Mutex
	fence  uint64
	holder string
}

// Do runs write if fence is accepted for resource: higher than the newest
// fence accepted for it, or equal to it with the same holder (one lease
// writing twice). Otherwise it returns an error wrapping ErrStale and does
// not call write. holder identifies the lease: pass Lease.Token, which is
// unique to each acquisition, or another id that no other lease uses.
//
// The check and write are one step: write runs with the resource locked,
// so no newer fence can be accepted for it until write returns, and a
// write never lands after a newer holder's. Keep write short: Do calls for
// the same resource wait for it. Different resources do not wait for each
// other.
//
// The fence is accepted before write runs and stays accepted when write
// fails or panics: a newer holder has shown up, and older ones stay out.
// Do returns write's error as is.
//
// Bad input (fence 0, an empty or invalid resource name or holder, a nil
// write) returns an error wrapping ErrInvalid and changes nothing.
func (g *Guard) Do(resource string, fence uint64, holder string, write func() error) error {
	if err := check(resource, fence, holder); err != nil {
		return err
	}
	if write == nil {
		return invalid("nil write function for resource %q", resource)
	}
	r := g.resource(resource)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !accepts(r.fence, r.holder, fence, holder) {
		return stale(resource, fence, r.fence)
	}
	r.fence, r.holder = fence, holder
	return write()
}

// resource returns the state of one resource, created on first use.
func (g *Guard) resource(name string) *guarded {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.resources[name]
	if r == nil {
		if g.resources == nil {
			g.resources = make(map[string]*guarded)
		}
		r = &guarded{}
		g.resources[name] = r
	}
	return r
}
