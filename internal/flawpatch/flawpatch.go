// Package flawpatch builds test binaries with a deliberate bug patched into
// the library's source at build time, for the conformance suite's self-test
// (memory's TestSuiteCatchesFlaws and TestFaultRunsCatchFlaws, netstore's
// TestSuiteCatchesLibraryFlaws). It is imported only by tests.
//
// A Flaw is a list of textual edits of production files, written in the
// tests that use it. Build applies them to copies of those files in a
// temporary directory and runs
//
//	go test -c -overlay=overlay.json [-race] -o flawed.test .
//
// in the current package's directory, where overlay.json maps each
// production file to its patched copy (see go help build, -overlay). The
// production files are never written, and no program built without the
// overlay contains the flaw: the flawed code lives only in _test.go files
// as text, and in the child binary.
//
// An edit whose old text is missing from its file, or found more than once,
// fails the build with an error naming the flaw, the file and the text: a
// flaw whose code moved is never silently a no-op.
package flawpatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Edit is one textual replacement in a production file.
type Edit struct {
	// File is the file's slash-separated path from the module's root
	// (the directory of the go.mod above the test's package).
	File string
	// Old is the exact text to replace, found exactly once in File. An
	// empty Old makes File a new file of the package, New all its text;
	// File must not exist then.
	Old string
	// New replaces Old.
	New string
}

// Flaw is a deliberate bug: its name and the edits that make it.
type Flaw struct {
	Name  string
	Edits []Edit
}

// Apply applies f's edits to the files under root and returns the patched
// texts by absolute file path. The edits of one file apply in order, each
// to the result of the one before.
func Apply(root string, f Flaw) (map[string][]byte, error) {
	if len(f.Edits) == 0 {
		return nil, fmt.Errorf("flaw %s: no edits", f.Name)
	}
	out := map[string][]byte{}
	for i, e := range f.Edits {
		path := filepath.Join(root, filepath.FromSlash(e.File))
		text, seen := out[path]
		if e.Old == "" {
			if seen {
				return nil, fmt.Errorf("flaw %s, edit %d: new file %s is edited before", f.Name, i, e.File)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("flaw %s, edit %d: new file %s exists (or cannot be checked: %v)", f.Name, i, e.File, err)
			}
			out[path] = []byte(e.New)
			continue
		}
		if !seen {
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, fmt.Errorf("flaw %s, edit %d: %w", f.Name, i, err)
			}
			text = b
		}
		switch n := bytes.Count(text, []byte(e.Old)); n {
		case 1:
		case 0:
			return nil, fmt.Errorf("flaw %s, edit %d: %s no longer contains the text to replace (the code moved: update the flaw):\n%s", f.Name, i, e.File, e.Old)
		default:
			return nil, fmt.Errorf("flaw %s, edit %d: %s contains the text to replace %d times; make it unique:\n%s", f.Name, i, e.File, n, e.Old)
		}
		out[path] = bytes.Replace(text, []byte(e.Old), []byte(e.New), 1)
	}
	return out, nil
}

// ModuleRoot returns the directory of the go.mod that holds dir.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", fmt.Errorf("flawpatch: no go.mod above %s", dir)
		}
		d = up
	}
}

// Build builds the test binary of the package in the current directory
// (where go test runs a package's tests) with f patched in, with -race if
// this binary has it, and returns the binary's path, in a directory that
// t's cleanup removes. It fails t if an edit does not apply or the build
// fails. The go command caches the patched packages by content, so a second
// run of the same flaw compiles nothing.
func Build(t testing.TB, f Flaw) string {
	t.Helper()
	bin, err := build(t.TempDir(), f)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// build is Build into dir, which must exist.
func build(dir string, f Flaw) (string, error) {
	root, err := ModuleRoot(".")
	if err != nil {
		return "", err
	}
	patched, err := Apply(root, f)
	if err != nil {
		return "", err
	}
	replace := map[string]string{}
	for path, text := range patched {
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return "", err
		}
		copyPath := filepath.Join(dir, strings.ReplaceAll(filepath.ToSlash(rel), "/", "__"))
		if err := os.WriteFile(copyPath, text, 0o644); err != nil {
			return "", err
		}
		replace[path] = copyPath
	}
	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", err
	}
	overlayPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayPath, overlay, 0o644); err != nil {
		return "", err
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("flaw %s: the self-test builds a flawed copy with the go command: %w", f.Name, err)
	}
	bin := filepath.Join(dir, "flawed.test")
	args := []string{"test", "-c", "-vet=off", "-overlay=" + overlayPath, "-o=" + bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goTool, append(args, ".")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("flaw %s: building the flawed test binary: %w\n%s", f.Name, err, out)
	}
	return bin, nil
}

// Builder builds flawed test binaries into one directory, each flaw once,
// and can build ahead in the background, one build at a time, while the
// children of earlier flaws run: they mostly wait on timers, and the
// builds then cost the run little time.
type Builder struct {
	mu     sync.Mutex
	dir    string // made at the first build
	dirErr error
	builds map[string]*flawBuild
	wg     sync.WaitGroup
}

type flawBuild struct {
	started bool // under Builder.mu
	done    chan struct{}
	bin     string
	err     error
}

// NewBuilder returns a Builder. It makes a temporary directory at its first
// build; Close removes it.
func NewBuilder() *Builder {
	return &Builder{builds: map[string]*flawBuild{}}
}

// get returns f's build, made if need be, and whether the caller is to run
// it (it had not started).
func (b *Builder) get(f Flaw) (*flawBuild, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fb, ok := b.builds[f.Name]
	if !ok {
		if b.dir == "" && b.dirErr == nil {
			b.dir, b.dirErr = os.MkdirTemp("", "flawpatch-")
		}
		fb = &flawBuild{done: make(chan struct{}), err: b.dirErr}
		b.builds[f.Name] = fb
	}
	run := !fb.started
	fb.started = true
	return fb, run
}

func (b *Builder) run(fb *flawBuild, f Flaw) {
	defer close(fb.done)
	if fb.err != nil {
		return
	}
	dir := filepath.Join(b.dir, f.Name)
	if fb.err = os.Mkdir(dir, 0o755); fb.err == nil {
		fb.bin, fb.err = build(dir, f)
	}
}

// Prepare starts building flaws in the background, in order, one at a
// time, skipping those whose build a caller of Binary already started.
func (b *Builder) Prepare(flaws ...Flaw) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for _, f := range flaws {
			if fb, run := b.get(f); run {
				b.run(fb, f)
			}
		}
	}()
}

// Binary returns the path of f's test binary: the one built or being built
// already, or one built now. It fails t if the build failed.
func (b *Builder) Binary(t testing.TB, f Flaw) string {
	t.Helper()
	fb, run := b.get(f)
	if run {
		b.run(fb, f)
	}
	<-fb.done
	if fb.err != nil {
		t.Fatal(fb.err)
	}
	return fb.bin
}

// Close waits for the background builds to end and removes the binaries.
func (b *Builder) Close() error {
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir == "" {
		return nil
	}
	return os.RemoveAll(b.dir)
}
