package redis

import (
	"fmt"
	"time"

	"github.com/distlock/lock"
	"github.com/distlock/lock/backend"
)

// checkMaxTTL says what is wrong with a maximum TTL (WithMaxTTL), or nil
// when nothing is.
func checkMaxTTL(d time.Duration) error {
	if d < MinTTL || d > lock.MaxTTL {
		return fmt.Errorf("%w: redis: maximum TTL %v (WithMaxTTL) must be at least %v and at most %v (lock.MaxTTL)", backend.ErrInvalid, d, MinTTL, lock.MaxTTL)
	}
	return nil
}

// checkTTL refuses a TTL above the backend's maximum, and every TTL when
// the maximum itself is out of range: New takes any option, and reports
// a bad one here, at each call, rather than grant with no maximum.
func (b *Backend) checkTTL(ttl time.Duration) error {
	if err := checkMaxTTL(b.opts.maxTTL); err != nil {
		return err
	}
	if ttl > b.opts.maxTTL {
		return fmt.Errorf("%w: redis: TTL %v is above this backend's maximum of %v (WithMaxTTL, URL parameter maxttl)", backend.ErrInvalid, ttl, b.opts.maxTTL)
	}
	return nil
}
