package simredis

import (
	"context"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// quiet drops go-redis's messages: the simulated network breaks
// connections all the time, and go-redis reports each failed dial.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	goredis.SetLogger(quiet{})
	os.Exit(m.Run())
}
