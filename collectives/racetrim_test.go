package collectives_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRaceTrimmedTestsRunWhole: a test that does less under the race
// detector (it looks at raceEnabled) must be named by make test's run of
// the collectives without it, or what it leaves out runs in no CI job.
func TestRaceTrimmedTestsRunWhole(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Skipf("no Makefile beside the package (%v)", err)
	}
	var pattern string
	for _, line := range strings.Split(string(mk), "\n") {
		if strings.Contains(line, "test -count=1") && strings.HasSuffix(strings.TrimSpace(line), "./collectives") {
			if m := regexp.MustCompile(`-run '([^']*)'`).FindStringSubmatch(line); m != nil {
				pattern = m[1]
			}
		}
	}
	if pattern == "" {
		t.Fatal("the Makefile has no race-free run of ./collectives with -run '…'")
	}
	run := regexp.MustCompile(pattern)
	files, _ := filepath.Glob("*_test.go")
	fset := token.NewFileSet()
	var trimmed int
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			uses := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok && id.Name == "raceEnabled" {
					uses = true
				}
				return !uses
			})
			if !uses {
				continue
			}
			trimmed++
			if !run.MatchString(fn.Name.Name) {
				t.Errorf("%s (%s) does less under the race detector, and make test's race-free run (-run '%s') does not name it", fn.Name.Name, f, pattern)
			}
		}
	}
	if trimmed == 0 {
		t.Error("no test looks at raceEnabled: is this test reading the right files?")
	}
}
