package netstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Request ops: the first byte of a request body.
const (
	opAcquire  = 'a' // key token ttl -> fence ttl
	opRenew    = 'n' // key token ttl -> fence ttl
	opRelease  = 'r' // key token -> nothing
	opTransfer = 't' // key from to ttl fence reserve -> fence ttl next
	opInspect  = 'i' // key -> held token fence remaining
	opWatch    = 'w' // id key -> nothing; then pushes
	opUnwatch  = 'u' // id -> nothing
)

// Reply kinds: the first byte of a body from the server.
const (
	kindOK       = 'k' // then the op's results
	kindLocked   = 'l' // then the holder's remaining TTL
	kindNotHeld  = 'h'
	kindRefused  = 'x' // Transfer: an owner elsewhere waits
	kindInvalid  = 'v' // then a message
	kindError    = 'e' // then a message; the outcome is unknown
	kindWake     = '!' // a push, not a reply: then a watch id
	headerLen    = 4
	maxFrameBody = 64 << 10 // keys are at most lock.MaxKeyLen bytes
)

var errFrame = errors.New("malformed frame")

// frame starts a frame whose body begins with b: the length is filled in by
// done.
func frame(b byte) []byte {
	f := make([]byte, headerLen, 64)
	return append(f, b)
}

// done fills in f's length.
func done(f []byte) []byte {
	binary.BigEndian.PutUint32(f, uint32(len(f)-headerLen))
	return f
}

func putString(f []byte, s string) []byte {
	f = binary.AppendUvarint(f, uint64(len(s)))
	return append(f, s...)
}

func putUint(f []byte, v uint64) []byte { return binary.AppendUvarint(f, v) }

func putDuration(f []byte, d time.Duration) []byte { return putUint(f, uint64(d)) }

func putBool(f []byte, v bool) []byte {
	if v {
		return append(f, 1)
	}
	return append(f, 0)
}

// readFrame reads one frame and returns its body, which is never empty.
func readFrame(br *bufio.Reader) ([]byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n == 0 || n > maxFrameBody {
		return nil, fmt.Errorf("%w: body of %d bytes", errFrame, n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	return body, nil
}

// frameReady reports whether br holds a whole frame already: the server
// then answers it before flushing its replies, so that a pipeline's replies
// go out together.
func frameReady(br *bufio.Reader) bool {
	if br.Buffered() < headerLen {
		return false
	}
	h, _ := br.Peek(headerLen)
	return br.Buffered() >= headerLen+int(binary.BigEndian.Uint32(h))
}

// parser reads the fields of a body; the first error sticks.
type parser struct {
	b   []byte
	err error
}

func (p *parser) uint() uint64 {
	if p.err != nil {
		return 0
	}
	v, n := binary.Uvarint(p.b)
	if n <= 0 {
		p.err = errFrame
		return 0
	}
	p.b = p.b[n:]
	return v
}

func (p *parser) duration() time.Duration { return time.Duration(p.uint()) }

func (p *parser) bool() bool { return p.uint() != 0 }

func (p *parser) string() string {
	n := p.uint()
	if p.err != nil {
		return ""
	}
	if n > uint64(len(p.b)) {
		p.err = errFrame
		return ""
	}
	s := string(p.b[:n])
	p.b = p.b[n:]
	return s
}

// end reports an error if a field was missing or bytes are left over.
func (p *parser) end() error {
	if p.err == nil && len(p.b) > 0 {
		p.err = errFrame
	}
	return p.err
}
