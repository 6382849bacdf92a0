package conformance

import (
	"testing"

	"github.com/distlock/lock/backend"
)

// checkDeclarations compares the harness's declared capabilities with the
// backend's own (backend.Describer), when it has them: package lock acts on
// the backend's, the suite on the harness's, and a difference means one of
// them is wrong.
func (s *suite) checkDeclarations(t *testing.T) {
	t.Helper()
	b := s.backend(t)
	defer b.Close()
	d, ok := unguarded(b).(backend.Describer)
	if !ok {
		return
	}
	if got := d.Capabilities(); got != s.caps {
		t.Errorf("conformance: the harness declares %+v, the backend's Capabilities say %+v", s.caps, got)
	}
}
