package lock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/distlock/lock/backend"
)

// MaxHolderLen is the longest holder description in bytes (WithHolder).
const MaxHolderLen = backend.MaxLabel

// WithHolder sets the description of the holder stored with every lock
// taken (a Client option) or with this acquisition's lock (an option of
// TryAcquire, Acquire, TryDo or Do), for operators: Client.Inspect and
// lockctl status show it. The default is DefaultHolder(): host, pid and
// program name. "" stores no description. Valid: at most MaxHolderLen
// bytes of valid UTF-8 without control characters (no newlines, tabs or
// escape sequences: it ends up on terminals and in logs).
//
// A backend stores it only when it declares Capabilities.Labels (every
// backend of this module but netstore does); elsewhere the option is
// accepted and has no effect. The description travels in the acquire
// request and is stored beside the token it came with, in the same atomic
// step as the grant, and is reported only while that token holds the
// lock. A lock that a store hands on to a waiter of another process shows
// no description on some stores (see each backend's package doc).
func WithHolder(description string) Option {
	return func(c *config) {
		if err := checkHolder(description); err != nil {
			c.fail("WithHolder(%.40q): %v", description, err)
			return
		}
		c.holder, c.holderSet = description, true
	}
}

// CheckHolder returns nil when s is a valid holder description (see
// WithHolder), and otherwise an error wrapping ErrInvalidOption that says
// what is wrong. Tools call it to validate a description before sending
// anything.
func CheckHolder(s string) error {
	if err := checkHolder(s); err != nil {
		return invalid(ErrInvalidOption, "holder description %.40q: %v", s, err)
	}
	return nil
}

// checkHolder reports what is wrong with a holder description.
func checkHolder(s string) error {
	if len(s) > MaxHolderLen {
		return fmt.Errorf("the description is %d bytes long; at most %d (MaxHolderLen) are valid", len(s), MaxHolderLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("the description is not valid UTF-8")
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("the description has a control character %U at byte %d; printable characters and spaces are valid", r, i)
		}
	}
	return nil
}

// DefaultHolder returns the holder description stored when WithHolder is
// not given: "HOST PID PROGRAM", the host name, the process id and the
// program's base name, with control characters replaced by '?' and cut
// to MaxHolderLen bytes. It is read once per process.
func DefaultHolder() string { return defaultHolder() }

var defaultHolder = sync.OnceValue(func() string {
	prog := "unknown-program"
	if len(os.Args) > 0 && os.Args[0] != "" {
		prog = filepath.Base(os.Args[0])
	}
	return HolderFor(prog)
})

// HolderFor returns the holder description "HOST PID PROGRAM" for this
// host and process, naming program (DefaultHolder names this program;
// a tool that holds a lock for a command it runs names the command),
// made valid by SanitizeHolder.
func HolderFor(program string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return SanitizeHolder(host + " " + strconv.Itoa(os.Getpid()) + " " + program)
}

// SanitizeHolder makes s a valid holder description (see WithHolder): it
// replaces invalid UTF-8 and control characters with '?' and cuts the
// result to at most MaxHolderLen bytes on a character boundary. For
// descriptions built from input the program does not control, such as a
// command line.
func SanitizeHolder(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > MaxHolderLen {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Holder is a key's holder as the store sees it (Client.Inspect).
type Holder struct {
	// Held is false when nobody holds the key; the other fields are then
	// zero.
	Held bool
	// Description is the holder's description (WithHolder), or "" when
	// the store keeps none for it (the backend does not declare
	// Capabilities.Labels, the holder set none, or the store handed the
	// lock on to a waiter without one).
	Description string
	// Fence is the holder's fence as its Lease.Fence reports it (under
	// this Client's fence epoch, WithFenceEpoch).
	Fence uint64
	// Remaining is the holder's remaining TTL as the store sees it, or 0
	// when the store does not say. The store may keep the lock a little
	// longer (see backend.Capabilities.ExpirySlack), and a live holder
	// renews it.
	Remaining time.Duration
}

// Inspect reads who holds key, as the store sees it now: a read that
// changes nothing. It fails with ErrInvalidKey for a bad key and with an
// error wrapping errors.ErrUnsupported when the backend cannot be read
// (it implements no backend.Inspector; every backend of this module
// does).
func (c *Client) Inspect(ctx context.Context, key string) (Holder, error) {
	if err := c.check("inspect", key, ctx); err != nil {
		return Holder{}, err
	}
	if err := checkKey("inspect", key); err != nil {
		return Holder{}, err
	}
	in, ok := c.b.(backend.Inspector)
	if !ok {
		return Holder{}, wrap("inspect", key, fmt.Errorf("the backend %T cannot report a key's holder: %w", c.b, errors.ErrUnsupported))
	}
	h, err := in.Inspect(ctx, key)
	if err != nil {
		return Holder{}, wrap("inspect", key, err)
	}
	if !h.Held {
		return Holder{}, nil
	}
	return Holder{Held: true, Description: h.Label, Fence: c.cfg.fence(h.Fence), Remaining: h.Remaining}, nil
}

// labelled returns ctx carrying cfg's holder description for the requests
// that grant a lock, when the backend stores one.
func (c *Client) labelled(ctx context.Context, cfg *config) context.Context {
	if !c.caps.Labels || cfg.holder == "" {
		return ctx
	}
	return backend.WithLabel(ctx, cfg.holder)
}
