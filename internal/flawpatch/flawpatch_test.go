package flawpatch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "p", "a.go"), []byte("package p\n\nfunc f() int { return 1 }\n\nfunc g() int { return 2 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Apply(root, Flaw{Name: "two", Edits: []Edit{
		{File: "p/a.go", Old: "return 1", New: "return 3"},
		{File: "p/a.go", Old: "return 3 }", New: "return 4 }"}, // applies to the result of the edit before
		{File: "p/b.go", New: "package p\n"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if a := string(got[filepath.Join(root, "p", "a.go")]); !strings.Contains(a, "return 4") || !strings.Contains(a, "return 2") {
		t.Errorf("patched a.go:\n%s", a)
	}
	if b := string(got[filepath.Join(root, "p", "b.go")]); b != "package p\n" {
		t.Errorf("new b.go: %q", b)
	}
	if _, err := os.Stat(filepath.Join(root, "p", "b.go")); err == nil {
		t.Error("Apply wrote a file")
	}

	for _, tc := range []struct {
		name string
		edit Edit
		want string
	}{
		{"moved", Edit{File: "p/a.go", Old: "return 5", New: "return 6"}, "flaw moved, edit 0: p/a.go no longer contains the text to replace"},
		{"twice", Edit{File: "p/a.go", Old: "func ", New: "func  "}, "flaw twice, edit 0: p/a.go contains the text to replace 2 times"},
		{"exists", Edit{File: "p/a.go", New: "package p\n"}, "flaw exists, edit 0: new file p/a.go exists"},
		{"nofile", Edit{File: "p/c.go", Old: "x", New: "y"}, "flaw nofile, edit 0: open"},
	} {
		_, err := Apply(root, Flaw{Name: tc.name, Edits: []Edit{tc.edit}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("flaw %s: got error %v; want one that says %q", tc.name, err, tc.want)
		}
	}
	if _, err := Apply(root, Flaw{Name: "none"}); err == nil {
		t.Error("a flaw with no edits applied")
	}
}
