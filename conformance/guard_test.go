package conformance

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The guard keeps every optional interface of package backend: the list
// guardgen writes from names each interface type of package backend but the
// contract's own (Backend, and the Watch and Queue that its optional
// interfaces return) and Describer (the guard has Capabilities itself), and
// guard_gen.go is what guardgen writes now.
func TestGuardKeepsEveryOptionalInterface(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("../backend/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var decls []ast.Decl
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, f.Decls...)
	}
	var want []string
	for _, d := range decls {
		g, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, s := range g.Specs {
			ts, ok := s.(*ast.TypeSpec)
			if !ok {
				continue
			}
			if _, ok := ts.Type.(*ast.InterfaceType); !ok {
				continue
			}
			switch ts.Name.Name {
			case "Backend", "Watch", "Queue", "Describer":
			default:
				want = append(want, ts.Name.Name)
			}
		}
	}
	got := slices.Clone(optionalInterfaces)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the guard keeps %v; package backend's optional interfaces are %v: add the missing ones to conformance/internal/guardgen and run go generate", got, want)
	}

	out, err := exec.Command("go", "run", "./internal/guardgen", "-o", "-").Output()
	if err != nil {
		t.Fatalf("go run ./internal/guardgen: %v", err)
	}
	have, err := os.ReadFile("guard_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, have) {
		t.Error("guard_gen.go is not what conformance/internal/guardgen writes now: run go generate in package conformance")
	}
}
