// Package fencesql tests package fence's Table on real SQL databases:
// SQLite (modernc.org/sqlite, in process) and PostgreSQL (a server the
// tests start, from $LOCK_PG_BIN or Debian's packages). The drivers live
// in this test-only module, so that package fence requires none.
package fencesql

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
