// Package tcpproxy is a loopback TCP proxy for fault tests: it forwards bytes
// between clients and one server until told to cut them off. While cut off it
// holds every byte in both directions without closing anything, as a network
// partition that drops packets does to a TCP connection; healing delivers
// what was held, as TCP retransmission would.
package tcpproxy

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards connections from Addr to a target address.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	heal  chan struct{} // closed when the cut ends
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target. It stops at
// the end of the test.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tcpproxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: close both sides
		}
	}
}

// wait blocks while the proxy is cut off.
func (p *Proxy) wait() {
	p.mu.Lock()
	heal := p.heal
	p.mu.Unlock()
	if heal != nil {
		<-heal
	}
}

// Cut stops all forwarding: bytes are held, connections stay open.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		p.cut = true
		p.heal = make(chan struct{})
	}
}

// Heal resumes forwarding.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		p.cut = false
		close(p.heal)
		p.heal = nil
	}
}

// Close heals, stops listening and closes every connection. It is
// idempotent.
func (p *Proxy) Close() {
	p.Heal()
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
